/// \file
/// Every difference between the LibTorch versions accel supports (Debian's 1.13 and PyTorch 2.x) lives here.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/version.h>

#ifdef ACCEL_WITH_NCCL
#include <cuda_runtime.h>
#if ACCEL_TORCH_CUDA  // a LibTorch built with CUDA (PyTorch's), set by the accel::nccl CMake target
#include <c10/cuda/CUDAStream.h>
#endif
#endif

/// LibTorch's version as MAJOR * 100 + MINOR (113 for 1.13, 204 for 2.4).
#define ACCEL_TORCH_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)

namespace accel::detail::compat {

/// `Optimizer::zero_grad(set_to_none)`: 2.x has the flag; 1.13 only zeroes in place.
inline void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
#if ACCEL_TORCH_VERSION >= 200
  optimizer.zero_grad(set_to_none);
#else
  if (!set_to_none) {
    optimizer.zero_grad();
    return;
  }
  for (auto& group : optimizer.param_groups())
    for (auto& parameter : group.params()) parameter.mutable_grad().reset();
#endif
}

#ifdef ACCEL_WITH_NCCL
/// LibTorch's current CUDA stream on `device`, which NCCL work must be ordered with. A LibTorch without CUDA
/// (Debian's) has no CUDA tensors, so the legacy default stream is as good as any there.
inline cudaStream_t current_cuda_stream(c10::DeviceIndex device) {
#if ACCEL_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(device).stream();
#else
  (void)device;
  return cudaStreamLegacy;
#endif
}
#endif

}  // namespace accel::detail::compat
