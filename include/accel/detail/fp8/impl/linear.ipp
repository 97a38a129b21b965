/// \file
/// What linear.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../linear.hpp"

#if ACCEL_HAS_FLOAT8

namespace accel::detail::fp8 {

amax_reduction whole_amax(const routing::product_split* split, std::array<product_dim, 2> dims,
                          std::optional<int64_t> axis) {
  if (split == nullptr) return {};
  const auto divided =
      split->split == routing::product_split::dimension::output_features ? product_dim::N : product_dim::K;
  const bool spans = axis ? dims[static_cast<std::size_t>(*axis)] == divided : dims[0] == divided || dims[1] == divided;
  return spans ? split->max_over_group : amax_reduction{};
}

at::Tensor linear_function::forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                    const at::Tensor& weight, const layer_plan& plan,
                                    const routing::product_split* split) {
  const auto [x8, w8] = forward_casts(x, weight, plan, split);
  auto out = scaled_mm(x8, w8.t(), x.scalar_type(), true, plan.pad_inner_dim, plan.emulate);
  if (plan.kind == scaling::rowwise)
    ctx->save_for_backward({x, weight});  // recast along the other axis in backward
  else                                    // both as the backward's right operands
    ctx->save_for_backward({x8.right_operand(), x8.scale, w8.right_operand(), w8.scale});
  ctx->saved_data["kind"] = static_cast<int64_t>(plan.kind);
  ctx->saved_data["grad_dtype"] = static_cast<int64_t>(dtype_of(plan.format, role::grad_output));
  ctx->saved_data["pad"] = plan.pad_inner_dim;
  ctx->saved_data["emulate"] = plan.emulate;
  ctx->saved_data["split"] = static_cast<int64_t>(reinterpret_cast<std::intptr_t>(split));  // lives as the policy
  if (plan.delayed) {
    ctx->saved_data["grad_scale"] = plan.delayed->scale(plan.column + 2);
    ctx->saved_data["grad_slot"] = plan.delayed->slot(plan.column + 2);
  }
  return out;  // [rows, out_features], not a view: the caller may add a bias in place to its reshaped output
}

torch::autograd::variable_list linear_function::backward(torch::autograd::AutogradContext* ctx,
                                                         torch::autograd::variable_list grads) {
  const auto& g = grads[0];
  const auto kind = static_cast<scaling>(ctx->saved_data["kind"].toInt());
  const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["grad_dtype"].toInt());
  const bool pad = ctx->saved_data["pad"].toBool(), emulate = ctx->saved_data["emulate"].toBool();
  const auto saved = ctx->get_saved_variables();
  const auto* split =
      reinterpret_cast<const routing::product_split*>(static_cast<std::intptr_t>(ctx->saved_data["split"].toInt()));
  using enum product_dim;
  at::Tensor grad_input, grad_weight;
  if (kind == scaling::rowwise) {
    // torchao's rowwise recipe: each operand scaled along the dimension its matmul keeps.
    const auto &x = saved[0], &weight = saved[1];
    const auto g_rows = cast_dynamic(g, dtype, 1, true, whole_amax(split, {M, N}, 1));
    const auto g_columns = cast_dynamic(g, dtype, 0, true, whole_amax(split, {M, N}, 0));
    const auto w_columns = cast_dynamic(weight, at::kFloat8_e4m3fn, 0, true, whole_amax(split, {N, K}, 0));
    const auto x_columns = cast_dynamic(x, at::kFloat8_e4m3fn, 0, true, whole_amax(split, {M, K}, 0));
    grad_input = scaled_mm(g_rows, w_columns, g.scalar_type(), false, pad, emulate);
    grad_weight = scaled_mm(g_columns.t(), x_columns, g.scalar_type(), false, pad, emulate);
  } else {
    const scaled x8{saved[0], saved[1]}, w8{saved[2], saved[3]};
    const auto g8 =
        kind == scaling::delayed
            ? cast_delayed(g, ctx->saved_data["grad_scale"].toTensor(), ctx->saved_data["grad_slot"].toTensor(), dtype)
            : cast_dynamic(g, dtype, std::nullopt, false, whole_amax(split, {M, N}, std::nullopt));
    grad_input = scaled_mm(g8, w8, g.scalar_type(), false, pad, emulate);
    grad_weight = scaled_mm(g8.t(), x8, g.scalar_type(), false, pad, emulate);
  }
  return {grad_input, grad_weight, at::Tensor(), at::Tensor()};  // none for the plan and the split
}

scaled linear_function::cast_delayed(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& slot,
                                     c10::ScalarType dtype) {
  amax_history::record(slot, amax(x, std::nullopt));
  return cast_scaled(x, scale, dtype, false);
}

std::pair<scaled, scaled> linear_function::forward_casts(const at::Tensor& x, const at::Tensor& weight,
                                                         const layer_plan& plan, const routing::product_split* split) {
  using enum product_dim;
  const auto input_type = dtype_of(plan.format, role::input), weight_type = dtype_of(plan.format, role::weight);
  switch (plan.kind) {
    case scaling::tensorwise:
      return {cast_dynamic(x, input_type, std::nullopt, false, whole_amax(split, {M, K}, std::nullopt)),
              plan.gathered
                  ? *plan.gathered
                  : cast_dynamic(weight, weight_type, std::nullopt, false, whole_amax(split, {N, K}, std::nullopt))};
    case scaling::rowwise:
      return {cast_dynamic(x, input_type, 1, true, whole_amax(split, {M, K}, 1)),
              cast_dynamic(weight, weight_type, 1, true, whole_amax(split, {N, K}, 1))};
    case scaling::delayed:
      break;
  }
  const auto& h = *plan.delayed;
  return {cast_delayed(x, h.scale(plan.column), h.slot(plan.column), input_type),
          cast_delayed(weight, h.scale(plan.column + 1), h.slot(plan.column + 1), weight_type)};
}

const layer_plan* layer_table::find(const at::Tensor& operand, bool transposed) const {
  for (const auto& plan : plans_)
    if (routing::is_weight(operand, plan.weight, transposed)) return &plan;
  return nullptr;
}

layer_plan* layer_table::plan_of(const at::Tensor& weight) {
  for (auto& plan : plans_)
    if (plan.weight.unsafeGetTensorImpl() == weight.unsafeGetTensorImpl()) return &plan;
  return nullptr;
}

void layer_table::add(layer_plan plan) {
  if (find(plan.weight, false) == nullptr) plans_.push_back(std::move(plan));  // prepared twice: once is enough
}

at::Tensor float8_linear(const at::Tensor& input, const layer_plan& plan, const routing::product_split* split) {
  const auto device = input.device().type();
  const auto x = compat::autocast_enabled(device) ? input.to(compat::autocast_dtype(device)) : input;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
  // GCC 13 sees an out-of-bounds memmove in the vector<bool> that LibTorch's Function::apply reserves: a false
  // positive inside LibTorch (found building on Ubuntu 24.04), which -Werror would make a user's build error.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#endif
  const auto out = linear_function::apply(x.reshape({-1, x.size(-1)}), plan.weight, plan, split);
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
#pragma GCC diagnostic pop
#endif
  auto shape = input.sizes().vec();
  shape.back() = plan.weight.size(0);
  // Not a view, as `at::matmul`'s result is not: LibTorch's Linear adds the bias to a 3-D input's product in place,
  // which on a view would make autograd copy and zero the output's gradient (CopySlices) in every backward.
  return at::_unsafe_view(out, shape);
}

std::optional<at::Tensor> layer_table::route(const at::Tensor& input, const at::Tensor& operand, bool transposed,
                                             const at::Tensor* bias, const routing::product_split* split) const {
  const auto* plan = find(operand, transposed);
  if (plan == nullptr) return std::nullopt;
  const auto out = float8_linear(input, *plan, split);
  return bias != nullptr ? out + bias->to(out.scalar_type()) : out;
}

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8
