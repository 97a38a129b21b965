/// \file
/// The NCCL communicator of `data_parallel<nccl>`: NCCL used directly, its communicator bootstrapped through the
/// same TCPStore rendezvous as Gloo's. Gradient collectives (data_parallel's all-reduces, zero2's reduce-scatters)
/// run on a communication stream of their own, ordered after the work already queued on LibTorch's current stream,
/// so gradient buckets overlap the rest of backward.
/// Needs the `accel::nccl` CMake target (NCCL and the CUDA runtime).
// IWYU pragma: private, include <accel/parallel.hpp>
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "../../collectives.hpp"
#include "../compat.hpp"
#include "rendezvous.hpp"

namespace accel::detail {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw collective_error(std::string("accel: ") + what + " failed: " + cudaGetErrorString(status));
}
inline void check_nccl(ncclResult_t status, const char* what) {
  if (status != ncclSuccess)
    throw collective_error(std::string("accel: ") + what + " failed: " + ncclGetErrorString(status));
}

inline ncclDataType_t nccl_type(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kChar:
      return ncclInt8;
    case at::kByte:
    case at::kBool:
      return ncclUint8;
    default:
      throw collective_error(std::string("accel: NCCL cannot reduce tensors of type ") +
                             std::string(c10::toString(tensor.scalar_type())));
  }
}

/// CUDA tensors, one process per GPU. CPU tensors (the collectives' bookkeeping) are staged through the GPU.
class nccl_communicator {
 public:
  /// An all-reduce in flight on the communication stream. `wait()` orders the current stream after it
  /// (without blocking the CPU), as PyTorch's DDP does.
  class work {
   public:
    work(cudaEvent_t done, c10::DeviceIndex device) : done_(done), device_(device) {}
    work(work&& other) noexcept : done_(std::exchange(other.done_, nullptr)), device_(other.device_) {}
    work& operator=(work&&) = delete;
    ~work() {
      if (done_ != nullptr) cudaEventDestroy(done_);
    }
    /// Orders the stream current now (where the result is read) after the all-reduce.
    void wait() {
      auto reader = compat::current_cuda_stream(device_);
      check_cuda(cudaStreamWaitEvent(reader, done_, 0), "cudaStreamWaitEvent");
    }

   private:
    cudaEvent_t done_;
    c10::DeviceIndex device_;
  };

  nccl_communicator(const process_environment& env, std::chrono::milliseconds timeout)
      : nccl_communicator(env, rendezvous_store(env, timeout), timeout) {}

  /// A communicator of the same processes whose collectives are ordered apart from this one's: an NCCL communicator
  /// and a stream of its own, bootstrapped through this one's rendezvous under `name`. Every process creates it, at
  /// the same point.
  [[nodiscard]] std::unique_ptr<nccl_communicator> separate(const std::string& name) const {
    return std::unique_ptr<nccl_communicator>(
        new nccl_communicator(env_, c10::make_intrusive<c10d::PrefixStore>(name, store_), timeout_));
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  [[nodiscard]] int rank() const noexcept { return env_.rank; }
  [[nodiscard]] int size() const noexcept { return env_.world_size; }
  [[nodiscard]] const process_environment& environment() const noexcept { return env_; }

  /// Starts an in-place all-reduce (sum or max) of a contiguous CUDA tensor on the communication stream.
  [[nodiscard]] work all_reduce(at::Tensor& tensor, reduction op) {
    if (!tensor.is_cuda()) {  // bookkeeping on the CPU: reduce a GPU copy, synchronously
      auto staged = tensor.to(device_);
      all_reduce(staged, op).wait();
      finish("all_reduce");
      tensor.copy_(staged);
      return work(record(current()), device_.index());
    }
    after_current_stream();
    check_nccl(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<std::size_t>(tensor.numel()),
                             nccl_type(tensor), op == reduction::max ? ncclMax : ncclSum, comm_, stream_),
               "ncclAllReduce");
    return work(record(stream_), device_.index());
  }

  /// Starts a sum reduce-scatter on the communication stream: `input` (a contiguous CUDA tensor) holds size()
  /// segments of `output`'s length, the r-th bound for process r; `output` receives their sum for this one.
  [[nodiscard]] work reduce_scatter_into(at::Tensor& output, at::Tensor& input) {
    after_current_stream();
    check_nccl(ncclReduceScatter(input.data_ptr(), output.data_ptr(), static_cast<std::size_t>(output.numel()),
                                 nccl_type(input), ncclSum, comm_, stream_),
               "ncclReduceScatter");
    return work(record(stream_), device_.index());
  }

  void broadcast(at::Tensor& tensor, int root) {
    auto staged = tensor.to(device_);
    check_nccl(ncclBroadcast(staged.data_ptr(), staged.data_ptr(), static_cast<std::size_t>(staged.numel()),
                             nccl_type(staged), root, comm_, current()),
               "ncclBroadcast");
    finish("broadcast");
    if (!staged.is_same(tensor)) tensor.copy_(staged);
  }

  [[nodiscard]] std::vector<at::Tensor> all_gather(const at::Tensor& tensor) {
    auto input = tensor.to(device_).contiguous();
    auto output = at::empty({size() * input.numel()}, input.options());
    check_nccl(ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<std::size_t>(input.numel()),
                             nccl_type(input), comm_, current()),
               "ncclAllGather");
    finish("all_gather");
    std::vector<at::Tensor> pieces;
    for (auto& piece : output.chunk(size())) pieces.push_back(piece.view(tensor.sizes()).to(tensor.device()));
    return pieces;
  }

  /// Starts gathering every rank's `input` (a contiguous CUDA tensor of `n` elements) into the flat `output` of
  /// `size() * n` on the communication stream.
  [[nodiscard]] work all_gather_into(at::Tensor& output, at::Tensor& input) {
    after_current_stream();
    check_nccl(ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<std::size_t>(input.numel()),
                             nccl_type(input), comm_, stream_),
               "ncclAllGather");
    return work(record(stream_), device_.index());
  }

  void barrier() {
    auto token = at::zeros({1}, at::TensorOptions(device_));
    all_reduce(token, reduction::sum).wait();
    finish("barrier");
  }

 private:
  nccl_communicator(const process_environment& env, c10::intrusive_ptr<c10d::Store> store,
                    std::chrono::milliseconds timeout)
      : env_(env),
        device_(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank)),
        timeout_(timeout),
        store_(std::move(store)) {
    check_cuda(cudaSetDevice(env.local_rank), "cudaSetDevice(LOCAL_RANK)");
    ncclUniqueId id;
    if (env.rank == 0) {
      check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
      store_->set("nccl_unique_id", std::vector<std::uint8_t>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      auto bytes = store_->get("nccl_unique_id");  // waits for rank 0, up to the timeout
      if (bytes.size() != sizeof(id.internal))
        throw collective_error("accel: the NCCL id in the rendezvous store has " + std::to_string(bytes.size()) +
                               " bytes instead of " + std::to_string(sizeof(id.internal)) +
                               ": another job shares MASTER_ADDR:MASTER_PORT");
      std::copy(bytes.begin(), bytes.end(), id.internal);
    }
    check_nccl(ncclCommInitRank(&comm_, env.world_size, id, env.rank), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }

  [[nodiscard]] cudaStream_t current() const {
    if (comm_ == nullptr)
      throw collective_error("accel: the NCCL communicator was aborted after a timeout; the job cannot go on");
    return compat::current_cuda_stream(device_.index());
  }

  /// The communication stream waits for what the current stream has queued (the gradients' computation).
  void after_current_stream() {
    cudaEvent_t queued = record(current());
    check_cuda(cudaStreamWaitEvent(stream_, queued, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(queued);  // legal while pending: the wait above already holds it
  }

  static cudaEvent_t record(cudaStream_t stream) {
    cudaEvent_t event = nullptr;
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(event, stream), "cudaEventRecord");
    return event;
  }

  /// Blocks until the current stream's collectives are done, or the timeout: then the communicator is aborted
  /// and the collective raises, instead of hanging on a process that stopped.
  void finish(const char* operation) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    cudaEvent_t event = record(current());
    while (cudaEventQuery(event) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() > deadline) {
        cudaEventDestroy(event);
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw collective_error(std::string("accel: NCCL ") + operation + " timed out on rank " +
                               std::to_string(rank()) + " after " + std::to_string(timeout_.count()) +
                               " ms (accel::options::timeout): a process stopped or diverged; the communicator is "
                               "aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    cudaEventDestroy(event);
  }

  process_environment env_;
  c10::Device device_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace accel::detail
