/// \file
/// The Gloo communicator of `data_parallel<gloo>`: c10d's ProcessGroupGloo over a TCPStore rendezvous. The header
/// names no c10d type: c10d and Gloo are included where the communicator is defined (impl/gloo_communicator.ipp).
// IWYU pragma: private, include <accel/parallel.hpp>
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../launch.hpp"
#include "../../collectives.hpp"

namespace accel::detail {

class hang_watch;

/// CPU tensors, any number of processes per machine.
class gloo_communicator {
 public:
  /// A collective in flight. `wait()` waits for it, rethrowing a failure (a peer that died, a timeout) that names
  /// the operation, then runs what completes the result, if anything (1.13's reduce-scatter sums what it received).
  class work {
   public:
    explicit work(std::function<void()> wait) : wait_(std::move(wait)) {}
    void wait() {
      if (wait_) std::exchange(wait_, {})();
    }

   private:
    std::function<void()> wait_;
  };

  ACCEL_DECL gloo_communicator(const process_environment& env, std::chrono::milliseconds timeout);
  ACCEL_DECL ~gloo_communicator();
  gloo_communicator(const gloo_communicator&) = delete;
  gloo_communicator& operator=(const gloo_communicator&) = delete;

  /// A communicator of the same processes whose collectives are ordered apart from this one's: a process group of
  /// its own, connected through this one's rendezvous under `name`. Every process creates it, at the same point.
  [[nodiscard]] ACCEL_DECL std::unique_ptr<gloo_communicator> separate(const std::string& name) const;

  /// A communicator of `members` only (ranks of this one, this process among them): its rank is this process's index
  /// there, its size theirs. Connected through this one's rendezvous under `name`, which must name these members
  /// alone; only they create it, each at the same point (a device mesh's groups, device_mesh.hpp).
  [[nodiscard]] ACCEL_DECL std::unique_ptr<gloo_communicator> subgroup(const std::string& name,
                                                                       const std::vector<int>& members) const;

  [[nodiscard]] int rank() const noexcept { return env_.rank; }
  [[nodiscard]] int size() const noexcept { return env_.world_size; }
  [[nodiscard]] const process_environment& environment() const noexcept { return env_; }

  /// Starts an in-place all-reduce (sum or max) of a contiguous tensor.
  [[nodiscard]] ACCEL_DECL work all_reduce(at::Tensor& tensor, reduction op);

  /// Starts a sum reduce-scatter: `input` (contiguous) holds size() segments of `output`'s length, the r-th bound
  /// for process r; `output` receives the sum of every process's segment for this one, added in rank order once
  /// `wait()` returns. An all-to-all brings the segments: Gloo's own reduce-scatter (`_reduce_scatter_base` in 2.x;
  /// 1.13's `reduce_scatter` throws) took 22 ms for 16.8 MB on 2 processes here, against 14 ms for an all-reduce of
  /// it and 11 ms for the all-to-all and the sum.
  [[nodiscard]] ACCEL_DECL work reduce_scatter_into(at::Tensor& output, at::Tensor& input);

  ACCEL_DECL void broadcast(at::Tensor& tensor, int root);

  /// Every rank's tensor, in rank order (all of the same shape). An empty one needs no communication (every rank's
  /// is empty, being of the same shape), and Gloo's all-gather of 0 bytes divides by zero in LibTorch 1.13.
  [[nodiscard]] ACCEL_DECL std::vector<at::Tensor> all_gather(const at::Tensor& tensor);

  /// Starts gathering every rank's `input` (contiguous, `n` elements) into the flat `output` of `size() * n`, in
  /// rank order; `output` holds them once `wait()` returns. When `input` is this rank's place in `output` (in place),
  /// each rank's part is broadcast into its place instead: Gloo's all-gather would stage the whole result in a
  /// buffer of its own and copy it out, two passes over it.
  [[nodiscard]] ACCEL_DECL work all_gather_into(at::Tensor& output, at::Tensor& input);

  /// Starts one step of a ring: `send` (contiguous) to rank `to`, and `receive` (contiguous) from rank `from`, which
  /// holds the data once `wait()` returns (context parallelism's rotation of keys and values).
  [[nodiscard]] ACCEL_DECL work exchange(at::Tensor& send, int to, at::Tensor& receive, int from);

  /// Starts sending `tensor` (contiguous, kept alive until `wait()` returns) to rank `to` as message `tag`; Gloo sends
  /// it once `to` has posted the receive of that tag (pipeline stages, accel/pipeline.hpp).
  [[nodiscard]] ACCEL_DECL work send(at::Tensor& tensor, int to, int tag);

  /// Starts receiving message `tag` from rank `from` into `tensor` (contiguous, of the sent shape and type), which
  /// holds it once `wait()` returns.
  [[nodiscard]] ACCEL_DECL work receive(at::Tensor& tensor, int from, int tag);

  ACCEL_DECL void barrier();

  /// The name its collectives are recorded under in the flight recorder: "default" for the job's group, else the
  /// name it was made with.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// Starts the hang watch (flight_recorder.hpp) over the flight recorder, its processes coordinated through this
  /// communicator's rendezvous store; nothing when `hang_timeout` is 0 or the recorder is off. Once per process, on
  /// the job's group.
  ACCEL_DECL void start_hang_watch(std::chrono::milliseconds hang_timeout);

 private:
  struct group;  // the rendezvous store and c10d's ProcessGroupGloo

  ACCEL_DECL gloo_communicator(const process_environment& env, std::unique_ptr<group> made,
                               std::chrono::milliseconds timeout, std::string name, std::vector<int> job_ranks);

  /// Records a collective of this group in the flight recorder from its tensors; its record id.
  ACCEL_DECL std::uint64_t record(const char* operation, const at::Tensor& input, const at::Tensor& output,
                                  bool is_p2p = false);

  /// Whether `input` is this rank's part of `output`, where the gathered result puts it.
  [[nodiscard]] ACCEL_DECL bool in_place(const at::Tensor& output, const at::Tensor& input) const;

  process_environment env_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<group> group_;
  std::string name_;
  std::vector<int> job_ranks_;  // each member's rank in the job, in this group's rank order
  std::unique_ptr<hang_watch> watch_;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/gloo_communicator.ipp"
#endif
