/// \file
/// Float8 Linear layers without replacing the user's modules. A LibTorch module calls its children through members
/// of its own (`fc->forward(x)`, a non-virtual call), so a child replaced in the module tree would never run: what is
/// swapped is the computation. Each converted Linear's weight is listed in a `layer_table`; while a forward scope
/// of `accel::fp8` is alive, LibTorch's dispatcher sends the calls a Linear makes (`addmm`, `matmul`, `linear`)
/// through kernels on a dispatch key that runs before autocast and autograd, which compute the listed weights'
/// layers in float8 (`linear_function`, an autograd function) and send every other call on unchanged. The modules,
/// their parameters (the same tensors the optimizer holds) and `unwrap_model` stay the user's own.
// IWYU pragma: private, include <accel/fp8.hpp>
#pragma once

#include "../compat.hpp"  // ACCEL_HAS_FLOAT8: on a LibTorch without float8 this header declares nothing

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_FLOAT8
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/library.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../options.hpp"
#include "../../precision.hpp"
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

/// A Linear's three matmuls in float8 (torchao's `matmul_with_hp_or_float8_args`), on a 2-D input x (the rows of
/// every leading dimension): out = x @ weightᵀ with both
/// cast (fast accumulation, as torchao's and TransformerEngine's forward); in backward, grad_input = g @ weight and
/// grad_weight = gᵀ @ input with the gradient cast, accumulated in full. Outputs are in the input's type (the
/// compute type), gradients in the gradient's (autograd converts the weight's to its master type).
struct linear_function : torch::autograd::Function<linear_function> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const layer_plan& plan) {
    const auto [x8, w8] = forward_casts(x, weight, plan);
    auto out = scaled_mm(x8, {w8.data.t(), w8.scale.t()}, x.scalar_type(), true, plan.pad_inner_dim, plan.emulate);
    if (plan.kind == scaling::rowwise)
      ctx->save_for_backward({x, weight});  // recast along the other axis in backward
    else
      ctx->save_for_backward({x8.data, x8.scale, w8.data, w8.scale});
    ctx->saved_data["kind"] = static_cast<int64_t>(plan.kind);
    ctx->saved_data["grad_dtype"] = static_cast<int64_t>(dtype_of(plan.format, role::grad_output));
    ctx->saved_data["pad"] = plan.pad_inner_dim;
    ctx->saved_data["emulate"] = plan.emulate;
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
    at::Tensor grad_input, grad_weight;
    if (kind == scaling::rowwise) {
      // torchao's rowwise recipe: each operand scaled along the dimension its matmul keeps.
      const auto &x = saved[0], &weight = saved[1];
      const auto g_rows = cast_dynamic(g, dtype, 1, true), g_columns = cast_dynamic(g, dtype, 0, true);
      grad_input =
          scaled_mm(g_rows, cast_dynamic(weight, at::kFloat8_e4m3fn, 0, true), g.scalar_type(), false, pad, emulate);
      grad_weight = scaled_mm({g_columns.data.t(), g_columns.scale.t()}, cast_dynamic(x, at::kFloat8_e4m3fn, 0, true),
                              g.scalar_type(), false, pad, emulate);
    } else {
      const scaled x8{saved[0], saved[1]}, w8{saved[2], saved[3]};
      const auto g8 = kind == scaling::delayed ? cast_delayed(g, ctx->saved_data["grad_scale"].toTensor(),
                                                              ctx->saved_data["grad_slot"].toTensor(), dtype)
                                               : cast_dynamic(g, dtype, std::nullopt, false);
      grad_input = scaled_mm(g8, w8, g.scalar_type(), false, pad, emulate);
      grad_weight = scaled_mm({g8.data.t(), g8.scale}, x8, g.scalar_type(), false, pad, emulate);
    }
    return {grad_input, grad_weight, at::Tensor()};
  }

  /// Delayed scaling's cast: the amax recorded for later steps, the scale of this one used.
  static scaled cast_delayed(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& slot,
                             c10::ScalarType dtype) {
    amax_history::record(slot, amax(x, std::nullopt));
    return {cast(x, scale, dtype), scale};
  }

  /// The forward's casts of the input and the weight, by the plan's recipe.
  static std::pair<scaled, scaled> forward_casts(const at::Tensor& x, const at::Tensor& weight,
                                                 const layer_plan& plan) {
    const auto input_type = dtype_of(plan.format, role::input), weight_type = dtype_of(plan.format, role::weight);
    switch (plan.kind) {
      case scaling::tensorwise:
        return {cast_dynamic(x, input_type, std::nullopt, false),
                plan.gathered ? *plan.gathered : cast_dynamic(weight, weight_type, std::nullopt, false)};
      case scaling::rowwise:
        return {cast_dynamic(x, input_type, 1, true), cast_dynamic(weight, weight_type, 1, true)};
      case scaling::delayed:
        break;
    }
    const auto& h = *plan.delayed;
    return {cast_delayed(x, h.scale(plan.column), h.slot(plan.column), input_type),
            cast_delayed(weight, h.scale(plan.column + 1), h.slot(plan.column + 1), weight_type)};
  }
};

/// A policy's converted layers, found by their weight.
class layer_table {
 public:
  /// The plan of the layer whose weight `operand` is (`transposed`: whose `weight.t()` it is, what LibTorch's
  /// `F::linear` multiplies by), or none. Compared by storage, offset, sizes and strides, so that a parameter whose
  /// storage a sharded policy swaps is still found.
  [[nodiscard]] const layer_plan* find(const at::Tensor& operand, bool transposed) const {
    if (!operand.defined() || operand.dim() != 2) return nullptr;
    for (const auto& plan : plans_)
      if (is_weight(operand, plan.weight, transposed)) return &plan;
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

 private:
  static bool is_weight(const at::Tensor& operand, const at::Tensor& weight, bool transposed) {
    if (!operand.is_alias_of(weight) || operand.storage_offset() != weight.storage_offset()) return false;
    const int first = transposed ? 1 : 0, second = 1 - first;
    return operand.size(0) == weight.size(first) && operand.size(1) == weight.size(second) &&
           operand.stride(0) == weight.stride(first) && operand.stride(1) == weight.stride(second);
  }

  std::deque<layer_plan> plans_;  // stable addresses: forwards hold references to them
};

/// The dispatch key the routing kernels are registered on: the autocast key of PyTorch's private-use backend, which
/// runs before every other autocast key and autograd, and on which nothing registers these operators in a CPU or
/// CUDA program. It is enabled only inside fp8's forward scopes.
inline constexpr c10::DispatchKey routing_key = c10::DispatchKey::AutocastPrivateUse1;

/// The layers of the innermost fp8 forward scope on this thread.
inline thread_local const layer_table* active_layers = nullptr;

/// The layer's matmul in float8: its input cast to the autocast type first (torchao's Float8Linear), the casts and
/// matmuls as written (no autocast inside), the weight parameter itself as autograd's input.
inline at::Tensor float8_linear(const at::Tensor& input, const layer_plan& plan) {
  const auto device = input.device().type();
  const auto x = compat::autocast_enabled(device) ? input.to(compat::autocast_dtype(device)) : input;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
  // GCC 13 sees an out-of-bounds memmove in the vector<bool> that LibTorch's Function::apply reserves: a false
  // positive inside LibTorch (found building on Ubuntu 24.04), which -Werror would make a user's build error.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#endif
  const auto out = linear_function::apply(x.reshape({-1, x.size(-1)}), plan.weight, plan);
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
#pragma GCC diagnostic pop
#endif
  auto shape = input.sizes().vec();
  shape.back() = plan.weight.size(0);
  return out.view(shape);
}

/// The plan `operand` is the weight (or transposed weight) of, in the active scope.
inline const layer_plan* active_plan(const at::Tensor& operand, bool transposed) {
  return active_layers != nullptr ? active_layers->find(operand, transposed) : nullptr;
}

// What LibTorch's Linear calls (its `F::linear`): `addmm(bias, input, weight.t())` for a 2-D input with a bias, else
// `input.matmul(weight.t())` and `output += bias`; and `aten::linear` for a program that calls `torch::linear`. Each
// computes a listed layer in float8 and sends every other call on, unchanged. A bias is added in the output's type,
// as torchao does.

inline at::Tensor routed_linear(const at::Tensor& input, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias) {
  c10::impl::ExcludeDispatchKeyGuard outside(routing_key);
  const auto* plan = active_plan(weight, false);
  if (plan == nullptr) return at::linear(input, weight, bias);
  const auto out = float8_linear(input, *plan);
  return bias && bias->defined() ? out + bias->to(out.scalar_type()) : out;
}

inline at::Tensor routed_addmm(const at::Tensor& bias, const at::Tensor& input, const at::Tensor& weight_t,
                               const c10::Scalar& beta, const c10::Scalar& alpha) {
  c10::impl::ExcludeDispatchKeyGuard outside(routing_key);
  const bool plain = bias.dim() == 1 && beta.equal(1) && alpha.equal(1);
  const auto* plan = plain ? active_plan(weight_t, true) : nullptr;
  if (plan == nullptr) return at::addmm(bias, input, weight_t, beta, alpha);
  const auto out = float8_linear(input, *plan);
  return out + bias.to(out.scalar_type());
}

inline at::Tensor routed_matmul(const at::Tensor& input, const at::Tensor& weight_t) {
  c10::impl::ExcludeDispatchKeyGuard outside(routing_key);
  const auto* plan = input.dim() >= 1 ? active_plan(weight_t, true) : nullptr;
  return plan == nullptr ? at::matmul(input, weight_t) : float8_linear(input, *plan);
}

/// Registers the routing kernels (and a fall-through for every other operator) on `routing_key`, once per process. The
/// registrations live as long as the process (LibTorch's own static registrations do too).
inline void install_routing() {
  static const bool installed = [] {
    if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(routing_key))
      throw std::runtime_error(
          "accel::fp8 routes Linear layers through LibTorch's AutocastPrivateUse1 dispatch key, which something else "
          "in this process (a PrivateUse1 device backend) already uses");
    auto* fallback = new torch::Library(torch::Library::IMPL, "_", routing_key, __FILE__, __LINE__);
    fallback->fallback(torch::CppFunction::makeFallthrough());
    auto* kernels = new torch::Library(torch::Library::IMPL, "aten", routing_key, __FILE__, __LINE__);
    kernels->impl("linear", TORCH_FN(routed_linear));
    kernels->impl("addmm", TORCH_FN(routed_addmm));
    kernels->impl("matmul", TORCH_FN(routed_matmul));
    return true;
  }();
  (void)installed;
}

/// What `accel::fp8`'s forward scope does: bfloat16 autocast (Accelerate's for fp8) and the routing kernels for
/// `layers`, both restored when it ends.
class [[nodiscard]] routing_scope {
 public:
  routing_scope(const layer_table& layers, c10::DeviceType device)
      : autocast_(device, at::kBFloat16),
        previous_(active_layers),
        was_included_(c10::impl::tls_is_dispatch_key_included(routing_key)),
        was_excluded_(c10::impl::tls_is_dispatch_key_excluded(routing_key)) {
    active_layers = &layers;
    c10::impl::tls_set_dispatch_key_excluded(routing_key, false);
    c10::impl::tls_set_dispatch_key_included(routing_key, true);
  }
  routing_scope(const routing_scope&) = delete;
  routing_scope& operator=(const routing_scope&) = delete;
  ~routing_scope() {
    c10::impl::tls_set_dispatch_key_included(routing_key, was_included_);
    c10::impl::tls_set_dispatch_key_excluded(routing_key, was_excluded_);
    active_layers = previous_;
  }

 private:
  autocast_scope autocast_;
  const layer_table* previous_;
  bool was_included_;
  bool was_excluded_;
};

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8
