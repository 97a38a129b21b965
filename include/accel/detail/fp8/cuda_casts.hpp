/// \file
/// cast_kernel.hpp's kernel on CUDA: compiled by NVRTC for the device the first time a CUDA tensor is cast, loaded
/// and launched through the driver on LibTorch's current stream. NVRTC and the driver are opened at run time (as
/// LibTorch's own jiterator does), so this compiles against every LibTorch and links nothing: a CPU-only LibTorch
/// never has a CUDA tensor to cast. Where something is missing (no NVRTC, an architecture it does not know), the
/// casts stay ATen's, with one warning that says why. The loader is compiled once (impl/cuda_casts.ipp), and only
/// casts.ipp includes this header: in compiled mode a file that includes accel parses none of it.
// IWYU pragma: private, include <accel/fp8.hpp>
#pragma once

#include "../compat.hpp"  // ACCEL_HAS_FLOAT8: on a LibTorch without float8 this header declares nothing
#include "../config.hpp"

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>

#if ACCEL_HAS_FLOAT8
namespace accel::detail::fp8::kernel {

/// The kernels compiled to a cubin for compute capability major.minor (`sm_90` for an H100), or an error with
/// NVRTC's log.
ACCEL_DECL std::string compile_cubin(int major, int minor);

/// x times `scale`, saturated, in float8 `dtype`, and its transpose, by one kernel where x is a CUDA matrix it takes;
/// none otherwise (the caller casts with ATen).
ACCEL_DECL std::optional<std::pair<at::Tensor, at::Tensor>> cast_both_layouts(const at::Tensor& x,
                                                                              const at::Tensor& scale,
                                                                              c10::ScalarType dtype);

}  // namespace accel::detail::fp8::kernel
#endif  // ACCEL_HAS_FLOAT8

#if ACCEL_HEADER_ONLY
#include "impl/cuda_casts.ipp"
#endif
