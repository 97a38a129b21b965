/// \file
/// The arithmetic of float8 training, written once for every recipe: scales from amaxes, saturating casts, and the
/// scaled matmul with the operand layouts `at::_scaled_mm` takes. Each function is the sequence of LibTorch calls
/// that torchao's `float8` package (tensorwise and rowwise) and TransformerEngine's `DelayedScaling` perform, so
/// that tests/scripts/fp8_reference.py can repeat it with PyTorch's own ops and compare bit for bit.
// IWYU pragma: private, include <accel/fp8.hpp>
#pragma once

#include "../config.hpp"
#include "../compat.hpp"  // ACCEL_HAS_FLOAT8: on a LibTorch without float8 this header declares nothing

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_FLOAT8
#include <c10/core/GradMode.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>

#include "../../options.hpp"

namespace accel::detail::fp8 {

/// What a float8 tensor plays in a Linear's three matmuls (TransformerEngine's tensor indices, torchao's
/// `GemmInputRole`): the forward's input and weight, the backward's gradient of the output.
enum class role : int { input = 0, weight = 1, grad_output = 2 };
inline constexpr int roles = 3;

/// The float8 type of `r` in `format`.
ACCEL_DECL c10::ScalarType dtype_of(fp8_format format, role r);

/// The largest finite value of a float8 type: 448 for e4m3fn, 57344 for e5m2 (`torch.finfo(dtype).max`).
inline double largest(c10::ScalarType dtype) { return dtype == at::kFloat8_e5m2 ? 57344.0 : 448.0; }

/// torchao's `tensor_to_amax`: max |x| over the tensor, or along `axis` kept as a dimension of 1, in x's type. The
/// infinity norm is that maximum exactly, read in one pass (`max(abs(x))` writes |x| out first).
ACCEL_DECL at::Tensor amax(const at::Tensor& x, std::optional<int64_t> axis);

/// torchao's `amax_to_scale`: largest / max(amax, 1e-12) in float64, then float32; with `power_of_2`, rounded down
/// to a power of two (`_round_scale_down_to_power_of_2`, the rowwise recipe).
ACCEL_DECL at::Tensor amax_to_scale(const at::Tensor& amax, c10::ScalarType dtype, bool power_of_2);

/// `scale` as an operand that makes a product with `x` float32 whatever x's type: a float32 scalar held as a
/// dimension of 1 (a 0-dim tensor would take x's bfloat16), so the product reads x once and converts as it goes.
inline at::Tensor float32_factor(const at::Tensor& scale) { return scale.dim() == 0 ? scale.reshape({1}) : scale; }

/// A float8 tensor and the scale it was multiplied by (float32: a scalar, or one per row or column); where the cast
/// wrote it too (one kernel, on CUDA: cast_kernel.hpp), its transpose, contiguous, which the backward's matmuls take.
struct scaled {
  at::Tensor data;
  at::Tensor scale;
  at::Tensor transposed = {};

  /// The transposed operand: the contiguous copy where there is one, else a view (which `scaled_mm` copies).
  [[nodiscard]] ACCEL_DECL scaled t() const;
  /// The data laid out as `scaled_mm`'s right operand takes it (column-major), where the cast made that layout;
  /// else the data as it is.
  [[nodiscard]] at::Tensor right_operand() const { return transposed.defined() ? transposed.t() : data; }
};

/// `x` times `scale` in float32, clamped to the type's range and cast (torchao's `hp_tensor_and_scale_to_float8`
/// and `to_fp8_saturated`; TransformerEngine's cast saturates likewise). The clamp writes float8 as it stores: its
/// bounds are tensors because `clamp` with scalar bounds takes no output of another type.
ACCEL_DECL at::Tensor cast(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype);

/// `cast` where `scale` came from an amax at least x's own (the tensor's, its group's): |x| times it is at most the
/// largest value times (1 + 2^-24)^2, which rounds to the largest value, so the clamp would change nothing. The
/// product is written straight into float8 (one pass on a GPU: the kernel converts as it stores).
ACCEL_DECL at::Tensor cast_in_range(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype);

/// `x` cast by `scale` (`in_range`: a scale from an amax at least x's own, `cast_in_range`; else `cast`), with its
/// transpose too where one kernel writes both (a CUDA matrix, a scalar scale: the saturating cast either way).
ACCEL_DECL scaled cast_scaled(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype, bool in_range);

/// An amax made the whole tensor's, in place (a tensor-parallel slice's amax maxed over its group); empty: none.
using amax_reduction = std::function<void(at::Tensor&)>;

/// Dynamic scaling (torchao): the scale from `x`'s own amax, over the tensor or along `axis`; `whole` first makes it
/// the amax of the tensor `x` is a part of (DTensor's amax of a sharded tensor, in torchao under tensor parallelism).
ACCEL_DECL scaled cast_dynamic(const at::Tensor& x, c10::ScalarType dtype, std::optional<int64_t> axis, bool power_of_2,
                               const amax_reduction& whole = {});

/// `t` padded with zero columns (`dim` 1) or rows (`dim` 0) to a multiple of 16 (torchao's `pad_tensor_for_matmul`).
ACCEL_DECL at::Tensor padded(const at::Tensor& t, int64_t dim);

/// a @ b through `at::_scaled_mm`, with a's and b's float8 data and the scales they were multiplied by: row-major a,
/// column-major b (what cuBLASLt takes), the reciprocal scales, the output in `out_dtype` (torchao's
/// `preprocess_addmm` and `addmm_float8_unwrapped`). Rowwise scales without fast accumulation run the tensorwise
/// kernel and scale the output afterwards, as torchao does (its rowwise kernel is slow without fast accumulation).
/// `emulate`: a float32 matmul of the float8 values divided by their scales instead (`fp8_options::emulate`).
ACCEL_DECL at::Tensor scaled_mm(const scaled& a, const scaled& b, c10::ScalarType out_dtype, bool fast_accumulation,
                                bool pad_inner_dim, bool emulate = false);

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8

#if ACCEL_HEADER_ONLY
#include "impl/casts.ipp"
#endif
