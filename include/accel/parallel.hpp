/// \file
/// Parallel policies: which processes exist, which device each uses, how gradients are synchronised.
///
/// Available policies / when to use:
/// - `accel::single_process`: one process; CUDA device 0 when available (and `options::cpu` is false), else CPU.
/// - `accel::data_parallel<accel::gloo>`: one process per CPU (or node), gradients all-reduced through Gloo.
/// - `accel::data_parallel<accel::nccl>`: one process per GPU, gradients all-reduced through NCCL.
///   (`data_parallel` lands with issue #5.)
#pragma once

#include <c10/core/Device.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include "concepts.hpp"
#include "detail/diagnostics.hpp"
#include "options.hpp"

namespace accel {

/// One process, one device. Every collective is the identity and nothing is communicated.
struct single_process {
  using policy_category = parallel_tag;

  explicit single_process(const options& opts)
      : device_(!opts.cpu && torch::cuda::is_available() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU)) {}

  [[nodiscard]] const c10::Device& device() const noexcept { return device_; }
  [[nodiscard]] static constexpr int process_index() noexcept { return 0; }
  [[nodiscard]] static constexpr int local_process_index() noexcept { return 0; }
  [[nodiscard]] static constexpr int num_processes() noexcept { return 1; }
  static constexpr void wait_for_everyone() noexcept {}
  /// Nothing to broadcast or hook with one process.
  static constexpr void prepare_model(torch::nn::Module&) noexcept {}

 private:
  c10::Device device_;
};

/// Gloo (CPU tensors, any number of processes per machine).
struct gloo {
  using policy_category = backend_tag;
};
/// NCCL (CUDA tensors, one process per GPU).
struct nccl {
  using policy_category = backend_tag;
};

/// Multi-process data parallelism over `Backend`. Declared here so configurations name it; it lands with
/// issue #5.
template <class Backend>
struct data_parallel {
  static_assert(communication_backend<Backend>,
                "accel::data_parallel<Backend> takes accel::gloo (CPU) or accel::nccl (CUDA) as its backend");
  using policy_category = parallel_tag;
  using backend_type = Backend;

  template <class Options>
  explicit data_parallel(const Options&) {
    static_assert(detail::always_false<Options>,
                  "accel::data_parallel lands with issue #5 (data parallel training); use accel::single_process until "
                  "then");
  }
  const c10::Device& device() const;
  int process_index() const;
  int local_process_index() const;
  int num_processes() const;
  void wait_for_everyone();
  void prepare_model(torch::nn::Module&);
};

}  // namespace accel
