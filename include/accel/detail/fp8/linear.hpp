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

#include "../config.hpp"
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
ACCEL_DECL amax_reduction whole_amax(const routing::product_split* split, std::array<product_dim, 2> dims,
                                     std::optional<int64_t> axis);

/// A Linear's three matmuls in float8 (torchao's `matmul_with_hp_or_float8_args`), on a 2-D input x (the rows of
/// every leading dimension): out = x @ weightᵀ with both
/// cast (fast accumulation, as torchao's and TransformerEngine's forward); in backward, grad_input = g @ weight and
/// grad_weight = gᵀ @ input with the gradient cast, accumulated in full. Outputs are in the input's type (the
/// compute type), gradients in the gradient's (autograd converts the weight's to its master type).
struct linear_function : torch::autograd::Function<linear_function> {
  ACCEL_DECL static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                       const at::Tensor& weight, const layer_plan& plan,
                                       const routing::product_split* split);

  ACCEL_DECL static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                            torch::autograd::variable_list grads);

  /// Delayed scaling's cast: the amax recorded for later steps, the scale of this one used.
  ACCEL_DECL static scaled cast_delayed(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& slot,
                                        c10::ScalarType dtype);

  /// The forward's casts of the input and the weight, by the plan's recipe. Delayed scaling needs no `split`: its
  /// amaxes are maxed over every process at each step (`accel::fp8::step`), the tp group's too.
  ACCEL_DECL static std::pair<scaled, scaled> forward_casts(const at::Tensor& x, const at::Tensor& weight,
                                                            const layer_plan& plan,
                                                            const routing::product_split* split);
};

/// A policy's converted layers, found by their weight: the router of fp8's forward scope.
class layer_table : public routing::linear_router {
 public:
  /// The plan of the layer whose weight `operand` is (`transposed`: whose `weight.t()` it is), or none
  /// (`routing::is_weight`).
  [[nodiscard]] ACCEL_DECL const layer_plan* find(const at::Tensor& operand, bool transposed) const;
  /// The plan of the layer whose weight is the parameter `weight` itself (whatever storage it holds now), or none.
  [[nodiscard]] ACCEL_DECL layer_plan* plan_of(const at::Tensor& weight);
  ACCEL_DECL void add(layer_plan plan);
  [[nodiscard]] const std::deque<layer_plan>& plans() const noexcept { return plans_; }

  /// A listed layer computed in float8, its bias added in the output's type, as torchao does.
  [[nodiscard]] ACCEL_DECL std::optional<at::Tensor> route(const at::Tensor& input, const at::Tensor& operand,
                                                           bool transposed, const at::Tensor* bias,
                                                           const routing::product_split* split) const override;

 private:
  std::deque<layer_plan> plans_;  // stable addresses: forwards hold references to them
};

/// The layer's matmul in float8: its input cast to the autocast type first (torchao's Float8Linear), the casts and
/// matmuls as written (no autocast inside), the weight parameter itself as autograd's input.
ACCEL_DECL at::Tensor float8_linear(const at::Tensor& input, const layer_plan& plan,
                                    const routing::product_split* split);

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

#if ACCEL_HEADER_ONLY
#include "impl/linear.ipp"
#endif
