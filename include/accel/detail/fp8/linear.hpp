/// \file
/// Float8 Linear layers without replacing the user's modules. A LibTorch module calls its children through members
/// of its own (`fc->forward(x)`, a non-virtual call), so a child replaced in the module tree would never run: what is
/// swapped is the computation. Each converted Linear's weight is listed in a `layer_table`, a `routing::linear_router`
/// (detail/support/linear_routing.hpp); while a forward scope of `accel::fp8` is alive, LibTorch's dispatcher sends
/// the calls a Linear makes (`addmm`, `matmul`, `linear`) through kernels on a dispatch key that runs before autocast
/// and autograd, which compute the listed weights' layers in float8 (`linear_function`, an autograd function) and
/// send every other call on unchanged. The modules,
/// their parameters (the same tensors the optimizer holds) and `unwrap_model` stay the user's own.
// IWYU pragma: private, include <accel/fp8.hpp>
#pragma once

#include "../compat.hpp"  // ACCEL_HAS_FLOAT8: on a LibTorch without float8 this header declares nothing

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_FLOAT8
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../options.hpp"
#include "../../precision.hpp"
#include "../support/linear_routing.hpp"
#include "casts.hpp"
#include "delayed_scaling.hpp"
#include "scaling.hpp"

namespace accel::detail::fp8 {

/// One converted Linear: its name, its weight (the parameter itself), how its matmuls scale.
struct layer_plan {
  std::string name;
  at::Tensor weight;
  scaling kind;
  fp8_format format;
  bool pad_inner_dim;
  bool emulate;                     // float32 matmuls of the float8 values instead of `at::_scaled_mm`
  amax_history* delayed = nullptr;  // delayed scaling: the columns input, weight, grad_output from `column` on
  int column = 0;
  /// Tensorwise scaling under fully_sharded with `enable_fsdp_float8_all_gather`: the weight as gathered, in float8
  /// with its scale, while it is (the weight parameter holds it divided by the scale); the forward takes it as is.
  std::optional<scaled> gathered = std::nullopt;
};

/// The dimensions of a Linear's product out[M, N] = x[M, K] w[N, K]ᵀ: an operand has two (x: M, K; w: N, K; the
/// output's gradient: M, N).
enum class product_dim { M, N, K };

/// What makes the amax of an operand with dimensions `dims` the whole tensor's, when the product is a local part of
/// one split as `split` says (null: whole): the group's max, where the amax spans (along `axis`; none: over both
/// dimensions) the dimension the split divides; nothing else.
inline amax_reduction whole_amax(const routing::product_split* split, std::array<product_dim, 2> dims,
                                 std::optional<int64_t> axis) {
  if (split == nullptr) return {};
  const auto divided =
      split->split == routing::product_split::dimension::output_features ? product_dim::N : product_dim::K;
  const bool spans = axis ? dims[static_cast<std::size_t>(*axis)] == divided : dims[0] == divided || dims[1] == divided;
  return spans ? split->max_over_group : amax_reduction{};
}

/// A Linear's three matmuls in float8 (torchao's `matmul_with_hp_or_float8_args`), on a 2-D input x (the rows of
/// every leading dimension): out = x @ weightᵀ with both
/// cast (fast accumulation, as torchao's and TransformerEngine's forward); in backward, grad_input = g @ weight and
/// grad_weight = gᵀ @ input with the gradient cast, accumulated in full. Outputs are in the input's type (the
/// compute type), gradients in the gradient's (autograd converts the weight's to its master type).
struct linear_function : torch::autograd::Function<linear_function> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const layer_plan& plan, const routing::product_split* split) {
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

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
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
      const auto g8 = kind == scaling::delayed
                          ? cast_delayed(g, ctx->saved_data["grad_scale"].toTensor(),
                                         ctx->saved_data["grad_slot"].toTensor(), dtype)
                          : cast_dynamic(g, dtype, std::nullopt, false, whole_amax(split, {M, N}, std::nullopt));
      grad_input = scaled_mm(g8, w8, g.scalar_type(), false, pad, emulate);
      grad_weight = scaled_mm(g8.t(), x8, g.scalar_type(), false, pad, emulate);
    }
    return {grad_input, grad_weight, at::Tensor(), at::Tensor()};  // none for the plan and the split
  }

  /// Delayed scaling's cast: the amax recorded for later steps, the scale of this one used.
  static scaled cast_delayed(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& slot,
                             c10::ScalarType dtype) {
    amax_history::record(slot, amax(x, std::nullopt));
    return cast_scaled(x, scale, dtype, false);
  }

  /// The forward's casts of the input and the weight, by the plan's recipe. Delayed scaling needs no `split`: its
  /// amaxes are maxed over every process at each step (`accel::fp8::step`), the tp group's too.
  static std::pair<scaled, scaled> forward_casts(const at::Tensor& x, const at::Tensor& weight, const layer_plan& plan,
                                                 const routing::product_split* split) {
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
};

/// A policy's converted layers, found by their weight: the router of fp8's forward scope.
class layer_table : public routing::linear_router {
 public:
  /// The plan of the layer whose weight `operand` is (`transposed`: whose `weight.t()` it is), or none
  /// (`routing::is_weight`).
  [[nodiscard]] const layer_plan* find(const at::Tensor& operand, bool transposed) const {
    for (const auto& plan : plans_)
      if (routing::is_weight(operand, plan.weight, transposed)) return &plan;
    return nullptr;
  }
  /// The plan of the layer whose weight is the parameter `weight` itself (whatever storage it holds now), or none.
  [[nodiscard]] layer_plan* plan_of(const at::Tensor& weight) {
    for (auto& plan : plans_)
      if (plan.weight.unsafeGetTensorImpl() == weight.unsafeGetTensorImpl()) return &plan;
    return nullptr;
  }
  void add(layer_plan plan) {
    if (find(plan.weight, false) == nullptr) plans_.push_back(std::move(plan));  // prepared twice: once is enough
  }
  [[nodiscard]] const std::deque<layer_plan>& plans() const noexcept { return plans_; }

  /// A listed layer computed in float8, its bias added in the output's type, as torchao does.
  [[nodiscard]] std::optional<at::Tensor> route(const at::Tensor& input, const at::Tensor& operand, bool transposed,
                                                const at::Tensor* bias,
                                                const routing::product_split* split) const override;

 private:
  std::deque<layer_plan> plans_;  // stable addresses: forwards hold references to them
};

/// The layer's matmul in float8: its input cast to the autocast type first (torchao's Float8Linear), the casts and
/// matmuls as written (no autocast inside), the weight parameter itself as autograd's input.
inline at::Tensor float8_linear(const at::Tensor& input, const layer_plan& plan, const routing::product_split* split) {
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

inline std::optional<at::Tensor> layer_table::route(const at::Tensor& input, const at::Tensor& operand, bool transposed,
                                                    const at::Tensor* bias, const routing::product_split* split) const {
  const auto* plan = find(operand, transposed);
  if (plan == nullptr) return std::nullopt;
  const auto out = float8_linear(input, *plan, split);
  return bias != nullptr ? out + bias->to(out.scalar_type()) : out;
}

/// What `accel::fp8`'s forward scope does: bfloat16 autocast (Accelerate's for fp8) and the routing of `layers`,
/// both restored when it ends.
class [[nodiscard]] routing_scope {
 public:
  routing_scope(const layer_table& layers, c10::DeviceType device)
      : autocast_(device, at::kBFloat16), routing_(layers) {}

 private:
  autocast_scope autocast_;
  routing::routing_scope routing_;
};

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8
