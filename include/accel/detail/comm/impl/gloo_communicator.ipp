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
#include "../flight_recorder.hpp"
#include "../rendezvous.hpp"
#include "../../support/straggler_report.hpp"

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

/// Where a failed collective's flight record went, for its message.
inline std::string dump_after_failure() {
  if (!flight_record_directory() || !flight_recorder::process().enabled()) return "";
  try {
    return "; flight record in " + dump_flight_record();
  } catch (const std::exception& e) {
    return std::string("; ") + e.what();
  }
}

/// Waits for `pending`, naming the operation and the rank when it fails (and dumping the flight record); `record`
/// (the flight recorder's id, 0 for none) is started before and completed after.
inline void wait_for(c10d::Work& pending, const char* operation, int rank, std::uint64_t record = 0) {
  auto& recorder = flight_recorder::process();
  recorder.started(record);
  try {
    collective_wait_timer waiting;  // the straggler report leaves waits out of a process's own work
    pending.wait();
  } catch (const std::exception& e) {
    throw collective_error(std::string("accel: ") + operation + " failed on rank " + std::to_string(rank) + ": " +
                           first_line(e.what()) +
                           " (a timeout or a process that stopped; the first failing process's own error says "
                           "why)" +
                           dump_after_failure());
  }
  recorder.completed(record);
}

/// `pending` as a communicator's work, `finish` run once it has completed, then `record` completed.
inline gloo_communicator::work work_of(c10::intrusive_ptr<c10d::Work> pending, int rank, const char* operation,
                                       std::uint64_t record, std::function<void()> finish = {}) {
  // A work dropped unwaited (an abandoned backward) is no hang: its record is completed when the last copy goes.
  std::shared_ptr<void> dropped(nullptr, [record](void*) { flight_recorder::process().completed(record); });
  return gloo_communicator::work([pending = std::move(pending), rank, operation, record, finish = std::move(finish),
                                  dropped = std::move(dropped)] {
    flight_recorder::process().started(record);
    wait_for(*pending, operation, rank);
    if (finish) finish();
    flight_recorder::process().completed(record);
  });
}

/// A tensor's sizes and dtype into `sizes` and `dtypes`, reusing their capacity (no allocation once warm).
inline void describe(const at::Tensor& tensor, std::vector<std::vector<std::int64_t>>& sizes,
                     std::vector<std::string>& dtypes) {
  sizes.resize(1);
  dtypes.resize(1);
  if (!tensor.defined()) {
    sizes[0].clear();
    dtypes[0] = "Undefined";
    return;
  }
  sizes[0].assign(tensor.sizes().begin(), tensor.sizes().end());
  dtypes[0] = c10::toString(tensor.scalar_type());
}

/// The job's ranks 0..n-1.
inline std::vector<int> every_rank(int n) {
  std::vector<int> ranks(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) ranks[static_cast<std::size_t>(r)] = r;
  return ranks;
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
    : gloo_communicator(env, std::make_unique<group>(env, rendezvous_store(env, timeout), timeout), timeout, "default",
                        gloo_internals::every_rank(env.world_size)) {}

gloo_communicator::gloo_communicator(const process_environment& env, std::unique_ptr<group> made,
                                     std::chrono::milliseconds timeout, std::string name, std::vector<int> job_ranks)
    : env_(env), timeout_(timeout), group_(std::move(made)), name_(std::move(name)), job_ranks_(std::move(job_ranks)) {
  const int job_rank = job_ranks_.at(static_cast<std::size_t>(env_.rank));
  flight_recorder::process().add_group(name_, job_ranks_, job_rank, name_ == "default" ? env_.world_size : -1);
}

gloo_communicator::~gloo_communicator() = default;

std::uint64_t gloo_communicator::record(const char* operation, const at::Tensor& input, const at::Tensor& output,
                                        bool is_p2p) {
  auto& recorder = flight_recorder::process();
  if (!recorder.enabled()) return 0;
  thread_local collective_operands operands;
  gloo_internals::describe(input, operands.input_sizes, operands.input_dtypes);
  gloo_internals::describe(output, operands.output_sizes, operands.output_dtypes);
  return recorder.record(name_, operation, is_p2p, operands, timeout_);
}

void gloo_communicator::start_hang_watch(std::chrono::milliseconds hang_timeout) {
  if (watch_ || hang_timeout.count() == 0 || !flight_recorder::process().enabled()) return;
  auto store = group_->store;
  const std::string request = "accel/flight_recorder/dump", dumped = "accel/flight_recorder/dumped";
  hang_watch_links links{.request_dumps = [store, request] { store->set(request, std::vector<std::uint8_t>{'1'}); },
                         .dumps_requested = [store, request] { return store->check({request}); },
                         .confirm_dump = [store, dumped] { store->add(dumped, 1); },
                         .dumped = [store, dumped] { return store->add(dumped, 0); },
                         .world_size = env_.world_size};
  watch_ = std::make_unique<hang_watch>(flight_recorder::process(), hang_timeout, std::move(links));
}

void gloo_communicator::barrier() {
  const auto id = record("barrier", at::Tensor(), at::Tensor());
  gloo_internals::wait_for(*group_->process_group->barrier(), "barrier", env_.rank, id);
}

std::unique_ptr<gloo_communicator> gloo_communicator::separate(const std::string& name) const {
  return std::unique_ptr<gloo_communicator>(new gloo_communicator(
      env_, std::make_unique<group>(env_, c10::make_intrusive<c10d::PrefixStore>(name, group_->store), timeout_),
      timeout_, name, job_ranks_));
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
  std::vector<int> job_ranks;
  for (int m : members) job_ranks.push_back(job_ranks_.at(static_cast<std::size_t>(m)));
  // The same network device as the whole job's: loopback when every process is on this machine.
  member.local_world_size = env_.single_node() ? member.world_size : 1;
  member.local_rank = env_.single_node() ? member.rank : 0;
  return std::unique_ptr<gloo_communicator>(new gloo_communicator(
      member, std::make_unique<group>(member, c10::make_intrusive<c10d::PrefixStore>(name, group_->store), timeout_),
      timeout_, name, std::move(job_ranks)));
}

gloo_communicator::work gloo_communicator::all_reduce(at::Tensor& tensor, reduction op) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions reduce_options;
  reduce_options.reduceOp = op == reduction::max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  const auto id = record("all_reduce", tensor, tensor);
  return gloo_internals::work_of(group_->process_group->allreduce(tensors, reduce_options), env_.rank, "all_reduce",
                                 id);
}

gloo_communicator::work gloo_communicator::reduce_scatter_into(at::Tensor& output, at::Tensor& input) {
  auto received = at::empty_like(input);
  std::vector<std::int64_t> equal_splits;
  const auto id = record("reduce_scatter", input, output);
  auto pending = group_->process_group->alltoall_base(received, input, equal_splits, equal_splits);
  return gloo_internals::work_of(std::move(pending), env_.rank, "reduce_scatter", id, [received, output]() mutable {
    const auto segments = received.chunk(received.numel() / output.numel());
    output.copy_(segments[0]);
    for (std::size_t r = 1; r < segments.size(); ++r) output.add_(segments[r]);
  });
}

gloo_communicator::work gloo_communicator::exchange(at::Tensor& send, int to, at::Tensor& receive, int from) {
  std::vector<at::Tensor> outgoing{send};
  std::vector<at::Tensor> incoming{receive};
  // Two records, as PyTorch's send and recv, named with this group's ranks ("send 0->1", "recv 1<-0").
  const auto send_id = record(("send " + std::to_string(env_.rank) + "->" + std::to_string(to)).c_str(), send, send,
                              /*is_p2p=*/true);
  auto sent = group_->process_group->send(outgoing, to, /*tag=*/0);
  const auto receive_id = record(("recv " + std::to_string(env_.rank) + "<-" + std::to_string(from)).c_str(), receive,
                                 receive, /*is_p2p=*/true);
  auto received = group_->process_group->recv(incoming, from, /*tag=*/0);
  return gloo_internals::work_of(
      std::move(received), env_.rank, "exchange", receive_id,
      [sent, send_id, rank = env_.rank] { gloo_internals::wait_for(*sent, "exchange", rank, send_id); });
}

gloo_communicator::work gloo_communicator::send(at::Tensor& tensor, int to, int tag) {
  std::vector<at::Tensor> outgoing{tensor};
  const auto id = record(("send " + std::to_string(env_.rank) + "->" + std::to_string(to)).c_str(), tensor, tensor,
                         /*is_p2p=*/true);
  return gloo_internals::work_of(group_->process_group->send(outgoing, to, tag), env_.rank, "send", id);
}

gloo_communicator::work gloo_communicator::receive(at::Tensor& tensor, int from, int tag) {
  std::vector<at::Tensor> incoming{tensor};
  const auto id = record(("recv " + std::to_string(env_.rank) + "<-" + std::to_string(from)).c_str(), tensor, tensor,
                         /*is_p2p=*/true);
  return gloo_internals::work_of(group_->process_group->recv(incoming, from, tag), env_.rank, "receive", id);
}

void gloo_communicator::broadcast(at::Tensor& tensor, int root) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions broadcast_options;
  broadcast_options.rootRank = root;
  const auto id = record("broadcast", tensor, tensor);
  gloo_internals::wait_for(*group_->process_group->broadcast(tensors, broadcast_options), "broadcast", env_.rank, id);
}

std::vector<at::Tensor> gloo_communicator::all_gather(const at::Tensor& tensor) {
  if (tensor.numel() == 0) return std::vector<at::Tensor>(static_cast<std::size_t>(size()), tensor.clone());
  std::vector<at::Tensor> inputs{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  // Recorded as one gathered tensor, as PyTorch's analyser expects of an all_gather (the meta device allocates none).
  auto gathered_sizes = inputs[0].sizes().vec();
  gathered_sizes.insert(gathered_sizes.begin(), size());
  const auto id = record("all_gather", inputs[0], at::empty(gathered_sizes, inputs[0].options().device(at::kMeta)));
  gloo_internals::wait_for(*group_->process_group->allgather(outputs, inputs), "all_gather", env_.rank, id);
  return std::move(outputs[0]);
}

gloo_communicator::work gloo_communicator::all_gather_into(at::Tensor& output, at::Tensor& input) {
  const auto id = record("all_gather", input, output);
  if (size() == 1 || !in_place(output, input))
    return gloo_internals::work_of(compat::all_gather_into(*group_->process_group, output, input), env_.rank,
                                   "all_gather", id);
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  for (int r = 0; r < size(); ++r) {
    std::vector<at::Tensor> part{output.narrow(0, r * input.numel(), input.numel())};
    c10d::BroadcastOptions broadcast_options;
    broadcast_options.rootRank = r;
    parts.push_back(group_->process_group->broadcast(part, broadcast_options));
  }
  auto first = parts.front();
  return gloo_internals::work_of(std::move(first), env_.rank, "all_gather", id,
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
