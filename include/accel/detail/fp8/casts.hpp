/// \file
/// The arithmetic of float8 training, written once for every recipe: scales from amaxes, saturating casts, and the
/// scaled matmul with the operand layouts `at::_scaled_mm` takes. Each function is the sequence of LibTorch calls
/// that torchao's `float8` package (tensorwise and rowwise) and TransformerEngine's `DelayedScaling` perform, so
/// that tests/scripts/fp8_reference.py can repeat it with PyTorch's own ops and compare bit for bit.
// IWYU pragma: private, include <accel/fp8.hpp>
#pragma once

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
#include "cuda_casts.hpp"

namespace accel::detail::fp8 {

/// What a float8 tensor plays in a Linear's three matmuls (TransformerEngine's tensor indices, torchao's
/// `GemmInputRole`): the forward's input and weight, the backward's gradient of the output.
enum class role : int { input = 0, weight = 1, grad_output = 2 };
inline constexpr int roles = 3;

/// The float8 type of `r` in `format`.
inline c10::ScalarType dtype_of(fp8_format format, role r) {
  if (format == fp8_format::e5m2 || (format == fp8_format::hybrid && r == role::grad_output)) return at::kFloat8_e5m2;
  return at::kFloat8_e4m3fn;
}

/// The largest finite value of a float8 type: 448 for e4m3fn, 57344 for e5m2 (`torch.finfo(dtype).max`).
inline double largest(c10::ScalarType dtype) { return dtype == at::kFloat8_e5m2 ? 57344.0 : 448.0; }

/// torchao's `tensor_to_amax`: max |x| over the tensor, or along `axis` kept as a dimension of 1, in x's type. The
/// infinity norm is that maximum exactly, read in one pass (`max(abs(x))` writes |x| out first).
inline at::Tensor amax(const at::Tensor& x, std::optional<int64_t> axis) {
  constexpr double infinity = std::numeric_limits<double>::infinity();
  return axis ? at::linalg_vector_norm(x, infinity, {*axis}, /*keepdim=*/true) : at::linalg_vector_norm(x, infinity);
}

/// torchao's `amax_to_scale`: largest / max(amax, 1e-12) in float64, then float32; with `power_of_2`, rounded down
/// to a power of two (`_round_scale_down_to_power_of_2`, the rowwise recipe).
inline at::Tensor amax_to_scale(const at::Tensor& amax, c10::ScalarType dtype, bool power_of_2) {
  auto scale =
      (at::scalar_tensor(largest(dtype), amax.options().dtype(at::kDouble)) / at::clamp(amax.to(at::kDouble), 1e-12))
          .to(at::kFloat);
  return power_of_2 ? at::exp2(at::floor(at::log2(scale))) : scale;
}

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
  [[nodiscard]] scaled t() const {
    return transposed.defined() ? scaled{transposed, scale.t(), data} : scaled{data.t(), scale.t()};
  }
  /// The data laid out as `scaled_mm`'s right operand takes it (column-major), where the cast made that layout;
  /// else the data as it is.
  [[nodiscard]] at::Tensor right_operand() const { return transposed.defined() ? transposed.t() : data; }
};

/// `x` times `scale` in float32, clamped to the type's range and cast (torchao's `hp_tensor_and_scale_to_float8`
/// and `to_fp8_saturated`; TransformerEngine's cast saturates likewise). The clamp writes float8 as it stores: its
/// bounds are tensors because `clamp` with scalar bounds takes no output of another type.
inline at::Tensor cast(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype) {
  const c10::NoGradGuard not_recorded;  // out= refuses inputs that require grad while autograd records
  const auto product = x * float32_factor(scale);
  const auto top = at::scalar_tensor(largest(dtype), product.options());
  auto out = at::empty(x.sizes(), x.options().dtype(dtype));
  return at::clamp_out(out, product, -top, top);
}

/// `cast` where `scale` came from an amax at least x's own (the tensor's, its group's): |x| times it is at most the
/// largest value times (1 + 2^-24)^2, which rounds to the largest value, so the clamp would change nothing. The
/// product is written straight into float8 (one pass on a GPU: the kernel converts as it stores).
inline at::Tensor cast_in_range(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype) {
  // No float8 copy is differentiated (linear_function's backward casts anew), and out= refuses a weight that
  // requires grad while autograd records.
  const c10::NoGradGuard not_recorded;
  auto out = at::empty(x.sizes(), x.options().dtype(dtype));
  return at::mul_out(out, x, float32_factor(scale));
}

/// `x` cast by `scale` (`in_range`: a scale from an amax at least x's own, `cast_in_range`; else `cast`), with its
/// transpose too where one kernel writes both (a CUDA matrix, a scalar scale: the saturating cast either way).
inline scaled cast_scaled(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype, bool in_range) {
  if (scale.numel() == 1)
    if (auto both = kernel::cast_both_layouts(x, scale, dtype)) return {both->first, scale, both->second};
  return {in_range ? cast_in_range(x, scale, dtype) : cast(x, scale, dtype), scale};
}

/// An amax made the whole tensor's, in place (a tensor-parallel slice's amax maxed over its group); empty: none.
using amax_reduction = std::function<void(at::Tensor&)>;

/// Dynamic scaling (torchao): the scale from `x`'s own amax, over the tensor or along `axis`; `whole` first makes it
/// the amax of the tensor `x` is a part of (DTensor's amax of a sharded tensor, in torchao under tensor parallelism).
inline scaled cast_dynamic(const at::Tensor& x, c10::ScalarType dtype, std::optional<int64_t> axis, bool power_of_2,
                           const amax_reduction& whole = {}) {
  auto max = amax(x, axis);
  if (whole) whole(max);
  auto scale = amax_to_scale(max, dtype, power_of_2);
  return cast_scaled(x, scale, dtype, true);
}

/// `t` padded with zero columns (`dim` 1) or rows (`dim` 0) to a multiple of 16 (torchao's `pad_tensor_for_matmul`).
inline at::Tensor padded(const at::Tensor& t, int64_t dim) {
  const auto size = t.size(dim), missing = (16 - size % 16) % 16;
  if (missing == 0) return t;
  return dim == 1 ? at::constant_pad_nd(t, {0, missing}) : at::constant_pad_nd(t, {0, 0, 0, missing});
}

/// a @ b through `at::_scaled_mm`, with a's and b's float8 data and the scales they were multiplied by: row-major a,
/// column-major b (what cuBLASLt takes), the reciprocal scales, the output in `out_dtype` (torchao's
/// `preprocess_addmm` and `addmm_float8_unwrapped`). Rowwise scales without fast accumulation run the tensorwise
/// kernel and scale the output afterwards, as torchao does (its rowwise kernel is slow without fast accumulation).
/// `emulate`: a float32 matmul of the float8 values divided by their scales instead (`fp8_options::emulate`).
inline at::Tensor scaled_mm(const scaled& a, const scaled& b, c10::ScalarType out_dtype, bool fast_accumulation,
                            bool pad_inner_dim, bool emulate = false) {
  if (emulate)  // torchao's emulation (`float8_mm` with `emulate`)
    return at::mm(a.data.to(at::kFloat) / a.scale, b.data.to(at::kFloat) / b.scale).to(out_dtype);
  auto a_data = pad_inner_dim ? padded(a.data, 1) : a.data;
  const auto b_columns = b.right_operand();
  auto b_data = pad_inner_dim ? padded(b_columns, 0) : b_columns;
  if (!a_data.is_contiguous()) a_data = a_data.contiguous();
  if (b_data.is_contiguous()) b_data = b_data.t().contiguous().t();
  auto a_inverse = a.scale.reciprocal(), b_inverse = b.scale.reciprocal();
  const bool rowwise = a.scale.dim() == 2;
  // CUDA's rowwise kernel writes bfloat16 only: a float16 or float32 output goes through it (torchao's workaround).
  const auto written = rowwise && out_dtype != at::kBFloat16 ? at::kBFloat16 : out_dtype;
  std::optional<at::Tensor> after;
  if (rowwise && !fast_accumulation) {
    after = a_inverse * b_inverse;
    a_inverse = b_inverse = a_inverse.new_ones({});
  }
  auto out = at::_scaled_mm(a_data, b_data, a_inverse, b_inverse, {}, {}, written, fast_accumulation);
  if (after) out.mul_(*after);
  return written == out_dtype ? out : out.to(out_dtype);
}

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8
