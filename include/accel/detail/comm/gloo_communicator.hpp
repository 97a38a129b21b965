/// \file
/// The Gloo communicator of `data_parallel<gloo>`: c10d's ProcessGroupGloo over a TCPStore rendezvous.
// IWYU pragma: private, include <accel/parallel.hpp>
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../../launch.hpp"
#include "../../collectives.hpp"
#include "../compat.hpp"
#include "rendezvous.hpp"

namespace accel::detail {

/// The network device Gloo binds: GLOO_SOCKET_IFNAME when set (as in PyTorch), loopback when the job is on one
/// machine, else the address this machine's hostname resolves to.
inline std::shared_ptr<::gloo::transport::Device> gloo_device(const process_environment& env) {
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface != nullptr && *interface != '\0')
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  if (env.single_node()) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

/// CPU tensors, any number of processes per machine.
class gloo_communicator {
 public:
  /// A collective in flight. `wait()` rethrows a failure (a peer that died, a timeout) naming the operation, then
  /// runs what completes the result, if anything (1.13's reduce-scatter sums what it received).
  class work {
   public:
    work(c10::intrusive_ptr<c10d::Work> pending, int rank, const char* operation, std::function<void()> finish = {})
        : pending_(std::move(pending)), finish_(std::move(finish)), rank_(rank), operation_(operation) {}
    void wait() {
      wait_for(*pending_, operation_, rank_);
      if (finish_) std::exchange(finish_, {})();
    }

   private:
    c10::intrusive_ptr<c10d::Work> pending_;
    std::function<void()> finish_;
    int rank_;
    const char* operation_;
  };

  gloo_communicator(const process_environment& env, std::chrono::milliseconds timeout)
      : gloo_communicator(env, rendezvous_store(env, timeout), timeout) {}

  /// A communicator of the same processes whose collectives are ordered apart from this one's: a process group of
  /// its own, connected through this one's rendezvous under `name`. Every process creates it, at the same point.
  [[nodiscard]] std::unique_ptr<gloo_communicator> separate(const std::string& name) const {
    return std::unique_ptr<gloo_communicator>(
        new gloo_communicator(env_, c10::make_intrusive<c10d::PrefixStore>(name, store_), timeout_));
  }

  /// A communicator of `members` only (ranks of this one, this process among them): its rank is this process's index
  /// there, its size theirs. Connected through this one's rendezvous under `name`, which must name these members
  /// alone; only they create it, each at the same point (a device mesh's groups, device_mesh.hpp).
  [[nodiscard]] std::unique_ptr<gloo_communicator> subgroup(const std::string& name,
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
    return std::unique_ptr<gloo_communicator>(
        new gloo_communicator(member, c10::make_intrusive<c10d::PrefixStore>(name, store_), timeout_));
  }

  [[nodiscard]] int rank() const noexcept { return env_.rank; }
  [[nodiscard]] int size() const noexcept { return env_.world_size; }
  [[nodiscard]] const process_environment& environment() const noexcept { return env_; }

  /// Starts an in-place all-reduce (sum or max) of a contiguous tensor.
  [[nodiscard]] work all_reduce(at::Tensor& tensor, reduction op) {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions reduce_options;
    reduce_options.reduceOp = op == reduction::max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    return work(group_->allreduce(tensors, reduce_options), env_.rank, "all_reduce");
  }

  /// Starts a sum reduce-scatter: `input` (contiguous) holds size() segments of `output`'s length, the r-th bound
  /// for process r; `output` receives the sum of every process's segment for this one, added in rank order once
  /// `wait()` returns. An all-to-all brings the segments: Gloo's own reduce-scatter (`_reduce_scatter_base` in 2.x;
  /// 1.13's `reduce_scatter` throws) took 22 ms for 16.8 MB on 2 processes here, against 14 ms for an all-reduce of
  /// it and 11 ms for the all-to-all and the sum.
  [[nodiscard]] work reduce_scatter_into(at::Tensor& output, at::Tensor& input) {
    auto received = at::empty_like(input);
    std::vector<std::int64_t> equal_splits;
    auto pending = group_->alltoall_base(received, input, equal_splits, equal_splits);
    return work(std::move(pending), env_.rank, "reduce_scatter", [received, output]() mutable {
      const auto segments = received.chunk(received.numel() / output.numel());
      output.copy_(segments[0]);
      for (std::size_t r = 1; r < segments.size(); ++r) output.add_(segments[r]);
    });
  }

  void broadcast(at::Tensor& tensor, int root) {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions broadcast_options;
    broadcast_options.rootRank = root;
    wait_for(*group_->broadcast(tensors, broadcast_options), "broadcast", env_.rank);
  }

  /// Every rank's tensor, in rank order (all of the same shape). An empty one needs no communication (every rank's
  /// is empty, being of the same shape), and Gloo's all-gather of 0 bytes divides by zero in LibTorch 1.13.
  [[nodiscard]] std::vector<at::Tensor> all_gather(const at::Tensor& tensor) {
    if (tensor.numel() == 0) return std::vector<at::Tensor>(static_cast<std::size_t>(size()), tensor.clone());
    std::vector<at::Tensor> inputs{tensor.contiguous()};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(inputs[0]));
    wait_for(*group_->allgather(outputs, inputs), "all_gather", env_.rank);
    return std::move(outputs[0]);
  }

  /// Starts gathering every rank's `input` (contiguous, `n` elements) into the flat `output` of `size() * n`, in
  /// rank order; `output` holds them once `wait()` returns. When `input` is this rank's place in `output` (in place),
  /// each rank's part is broadcast into its place instead: Gloo's all-gather would stage the whole result in a
  /// buffer of its own and copy it out, two passes over it.
  [[nodiscard]] work all_gather_into(at::Tensor& output, at::Tensor& input) {
    if (size() == 1 || !in_place(output, input))
      return work(compat::all_gather_into(*group_, output, input), env_.rank, "all_gather");
    std::vector<c10::intrusive_ptr<c10d::Work>> parts;
    for (int r = 0; r < size(); ++r) {
      std::vector<at::Tensor> part{output.narrow(0, r * input.numel(), input.numel())};
      c10d::BroadcastOptions broadcast_options;
      broadcast_options.rootRank = r;
      parts.push_back(group_->broadcast(part, broadcast_options));
    }
    auto first = parts.front();
    return work(std::move(first), env_.rank, "all_gather", [parts = std::move(parts), rank = env_.rank] {
      for (const auto& part : parts) wait_for(*part, "all_gather", rank);
    });
  }

  void barrier() { wait_for(*group_->barrier(), "barrier", env_.rank); }

 private:
  gloo_communicator(const process_environment& env, c10::intrusive_ptr<c10d::Store> store,
                    std::chrono::milliseconds timeout)
      : env_(env), store_(std::move(store)), timeout_(timeout) {
    auto group_options = c10d::ProcessGroupGloo::Options::create(timeout);
    group_options->devices.push_back(gloo_device(env));
    group_options->threads = 2;  // as PyTorch: two per device, enough to overlap buckets with backward
    group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, env.rank, env.world_size, group_options);
  }

  /// Whether `input` is this rank's part of `output`, where the gathered result puts it.
  [[nodiscard]] bool in_place(const at::Tensor& output, const at::Tensor& input) const {
    return output.is_contiguous() && input.is_contiguous() && output.scalar_type() == input.scalar_type() &&
           output.numel() == input.numel() * size() &&
           static_cast<const char*>(input.data_ptr()) ==
               static_cast<const char*>(output.data_ptr()) + static_cast<std::int64_t>(env_.rank) * input.nbytes();
  }

  static void wait_for(c10d::Work& pending, const char* operation, int rank) {
    try {
      pending.wait();
    } catch (const std::exception& e) {
      throw collective_error(std::string("accel: ") + operation + " failed on rank " + std::to_string(rank) + ": " +
                             first_line(e.what()) +
                             " (a timeout or a process that stopped; the first failing process's own error says "
                             "why)");
    }
  }

  process_environment env_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
};

}  // namespace accel::detail
