/// \file
/// What gloo_communicator.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../gloo_communicator.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <stdexcept>

#include "../../compat.hpp"
#include "../rendezvous.hpp"

namespace accel::detail {

namespace gloo_internals {

/// The network device Gloo binds: GLOO_SOCKET_IFNAME when set (as in PyTorch), loopback when the job is on one
/// machine, else the address this machine's hostname resolves to.
inline std::shared_ptr<::gloo::transport::Device> device_for(const process_environment& env) {
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface != nullptr && *interface != '\0')
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  if (env.single_node()) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

/// Waits for `pending`, naming the operation and the rank when it fails.
inline void wait_for(c10d::Work& pending, const char* operation, int rank) {
  try {
    pending.wait();
  } catch (const std::exception& e) {
    throw collective_error(std::string("accel: ") + operation + " failed on rank " + std::to_string(rank) + ": " +
                           first_line(e.what()) +
                           " (a timeout or a process that stopped; the first failing process's own error says "
                           "why)");
  }
}

/// `pending` as a communicator's work, `finish` run once it has completed.
inline gloo_communicator::work work_of(c10::intrusive_ptr<c10d::Work> pending, int rank, const char* operation,
                                       std::function<void()> finish = {}) {
  return gloo_communicator::work([pending = std::move(pending), rank, operation, finish = std::move(finish)] {
    wait_for(*pending, operation, rank);
    if (finish) finish();
  });
}

}  // namespace gloo_internals

struct gloo_communicator::group {
  group(const process_environment& env, c10::intrusive_ptr<c10d::Store> rendezvous, std::chrono::milliseconds timeout)
      : store(std::move(rendezvous)) {
    auto group_options = c10d::ProcessGroupGloo::Options::create(timeout);
    group_options->devices.push_back(gloo_internals::device_for(env));
    group_options->threads = 2;  // as PyTorch: two per device, enough to overlap buckets with backward
    process_group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size, group_options);
  }
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> process_group;
};

gloo_communicator::gloo_communicator(const process_environment& env, std::chrono::milliseconds timeout)
    : gloo_communicator(env, std::make_unique<group>(env, rendezvous_store(env, timeout), timeout), timeout) {}

gloo_communicator::gloo_communicator(const process_environment& env, std::unique_ptr<group> made,
                                     std::chrono::milliseconds timeout)
    : env_(env), timeout_(timeout), group_(std::move(made)) {}

gloo_communicator::~gloo_communicator() = default;

void gloo_communicator::barrier() { gloo_internals::wait_for(*group_->process_group->barrier(), "barrier", env_.rank); }

std::unique_ptr<gloo_communicator> gloo_communicator::separate(const std::string& name) const {
  return std::unique_ptr<gloo_communicator>(new gloo_communicator(
      env_, std::make_unique<group>(env_, c10::make_intrusive<c10d::PrefixStore>(name, group_->store), timeout_),
      timeout_));
}

std::unique_ptr<gloo_communicator> gloo_communicator::subgroup(const std::string& name,
                                                               const std::vector<int>& members) const {
  process_environment member = env_;
  member.rank = -1;
  for (std::size_t i = 0; i < members.size(); ++i)
    if (members[i] == env_.rank) member.rank = static_cast<int>(i);
  if (member.rank < 0)
    throw std::invalid_argument("accel: rank " + std::to_string(env_.rank) + " creates the group " + name +
                                " without being one of its members; only the members create a group");
  member.world_size = static_cast<int>(members.size());
  // The same network device as the whole job's: loopback when every process is on this machine.
  member.local_world_size = env_.single_node() ? member.world_size : 1;
  member.local_rank = env_.single_node() ? member.rank : 0;
  return std::unique_ptr<gloo_communicator>(new gloo_communicator(
      member, std::make_unique<group>(member, c10::make_intrusive<c10d::PrefixStore>(name, group_->store), timeout_),
      timeout_));
}

gloo_communicator::work gloo_communicator::all_reduce(at::Tensor& tensor, reduction op) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions reduce_options;
  reduce_options.reduceOp = op == reduction::max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  return gloo_internals::work_of(group_->process_group->allreduce(tensors, reduce_options), env_.rank, "all_reduce");
}

gloo_communicator::work gloo_communicator::reduce_scatter_into(at::Tensor& output, at::Tensor& input) {
  auto received = at::empty_like(input);
  std::vector<std::int64_t> equal_splits;
  auto pending = group_->process_group->alltoall_base(received, input, equal_splits, equal_splits);
  return gloo_internals::work_of(std::move(pending), env_.rank, "reduce_scatter", [received, output]() mutable {
    const auto segments = received.chunk(received.numel() / output.numel());
    output.copy_(segments[0]);
    for (std::size_t r = 1; r < segments.size(); ++r) output.add_(segments[r]);
  });
}

gloo_communicator::work gloo_communicator::exchange(at::Tensor& send, int to, at::Tensor& receive, int from) {
  std::vector<at::Tensor> outgoing{send};
  std::vector<at::Tensor> incoming{receive};
  auto sent = group_->process_group->send(outgoing, to, /*tag=*/0);
  auto received = group_->process_group->recv(incoming, from, /*tag=*/0);
  return gloo_internals::work_of(std::move(received), env_.rank, "exchange",
                                 [sent, rank = env_.rank] { gloo_internals::wait_for(*sent, "exchange", rank); });
}

void gloo_communicator::broadcast(at::Tensor& tensor, int root) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions broadcast_options;
  broadcast_options.rootRank = root;
  gloo_internals::wait_for(*group_->process_group->broadcast(tensors, broadcast_options), "broadcast", env_.rank);
}

std::vector<at::Tensor> gloo_communicator::all_gather(const at::Tensor& tensor) {
  if (tensor.numel() == 0) return std::vector<at::Tensor>(static_cast<std::size_t>(size()), tensor.clone());
  std::vector<at::Tensor> inputs{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  gloo_internals::wait_for(*group_->process_group->allgather(outputs, inputs), "all_gather", env_.rank);
  return std::move(outputs[0]);
}

gloo_communicator::work gloo_communicator::all_gather_into(at::Tensor& output, at::Tensor& input) {
  if (size() == 1 || !in_place(output, input))
    return gloo_internals::work_of(compat::all_gather_into(*group_->process_group, output, input), env_.rank,
                                   "all_gather");
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  for (int r = 0; r < size(); ++r) {
    std::vector<at::Tensor> part{output.narrow(0, r * input.numel(), input.numel())};
    c10d::BroadcastOptions broadcast_options;
    broadcast_options.rootRank = r;
    parts.push_back(group_->process_group->broadcast(part, broadcast_options));
  }
  auto first = parts.front();
  return gloo_internals::work_of(std::move(first), env_.rank, "all_gather",
                                 [parts = std::move(parts), rank = env_.rank] {
                                   for (const auto& part : parts) gloo_internals::wait_for(*part, "all_gather", rank);
                                 });
}

bool gloo_communicator::in_place(const at::Tensor& output, const at::Tensor& input) const {
  return output.is_contiguous() && input.is_contiguous() && output.scalar_type() == input.scalar_type() &&
         output.numel() == input.numel() * size() &&
         static_cast<const char*>(input.data_ptr()) ==
             static_cast<const char*>(output.data_ptr()) + static_cast<std::int64_t>(env_.rank) * input.nbytes();
}

}  // namespace accel::detail
