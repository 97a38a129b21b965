/// \file
/// What casts.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../casts.hpp"
#include "../cuda_casts.hpp"

#if ACCEL_HAS_FLOAT8

namespace accel::detail::fp8 {

c10::ScalarType dtype_of(fp8_format format, role r) {
  if (format == fp8_format::e5m2 || (format == fp8_format::hybrid && r == role::grad_output)) return at::kFloat8_e5m2;
  return at::kFloat8_e4m3fn;
}

at::Tensor amax(const at::Tensor& x, std::optional<int64_t> axis) {
  constexpr double infinity = std::numeric_limits<double>::infinity();
  return axis ? at::linalg_vector_norm(x, infinity, {*axis}, /*keepdim=*/true) : at::linalg_vector_norm(x, infinity);
}

at::Tensor amax_to_scale(const at::Tensor& amax, c10::ScalarType dtype, bool power_of_2) {
  auto scale =
      (at::scalar_tensor(largest(dtype), amax.options().dtype(at::kDouble)) / at::clamp(amax.to(at::kDouble), 1e-12))
          .to(at::kFloat);
  return power_of_2 ? at::exp2(at::floor(at::log2(scale))) : scale;
}

scaled scaled::t() const {
  return transposed.defined() ? scaled{transposed, scale.t(), data} : scaled{data.t(), scale.t()};
}

at::Tensor cast(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype) {
  const c10::NoGradGuard not_recorded;  // out= refuses inputs that require grad while autograd records
  const auto product = x * float32_factor(scale);
  const auto top = at::scalar_tensor(largest(dtype), product.options());
  auto out = at::empty(x.sizes(), x.options().dtype(dtype));
  return at::clamp_out(out, product, -top, top);
}

at::Tensor cast_in_range(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype) {
  // No float8 copy is differentiated (linear_function's backward casts anew), and out= refuses a weight that
  // requires grad while autograd records.
  const c10::NoGradGuard not_recorded;
  auto out = at::empty(x.sizes(), x.options().dtype(dtype));
  return at::mul_out(out, x, float32_factor(scale));
}

scaled cast_scaled(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype, bool in_range) {
  if (scale.numel() == 1)
    if (auto both = kernel::cast_both_layouts(x, scale, dtype)) return {both->first, scale, both->second};
  return {in_range ? cast_in_range(x, scale, dtype) : cast(x, scale, dtype), scale};
}

scaled cast_dynamic(const at::Tensor& x, c10::ScalarType dtype, std::optional<int64_t> axis, bool power_of_2,
                    const amax_reduction& whole) {
  auto max = amax(x, axis);
  if (whole) whole(max);
  auto scale = amax_to_scale(max, dtype, power_of_2);
  return cast_scaled(x, scale, dtype, true);
}

at::Tensor padded(const at::Tensor& t, int64_t dim) {
  const auto size = t.size(dim), missing = (16 - size % 16) % 16;
  if (missing == 0) return t;
  return dim == 1 ? at::constant_pad_nd(t, {0, missing}) : at::constant_pad_nd(t, {0, 0, 0, missing});
}

at::Tensor scaled_mm(const scaled& a, const scaled& b, c10::ScalarType out_dtype, bool fast_accumulation,
                     bool pad_inner_dim, bool emulate) {
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
