/// \file
/// Linear layers computed otherwise without replacing the user's modules. A LibTorch module calls its children
/// through members of its own (`fc->forward(x)`, a non-virtual call) and has no forward hooks, so a child replaced in
/// the module tree would never run: what is swapped is the computation. A policy lists the weights of the layers it
/// computes otherwise in a `linear_router`; while one of its `routing_scope`s is alive, LibTorch's dispatcher sends
/// the calls a Linear makes (`addmm`, `matmul`, `linear`) and an Embedding's (`embedding`) through kernels on a
/// dispatch key that runs before autocast and autograd, which ask the active routers (innermost first) for the layer
/// and send every other call on unchanged. fp8 (detail/fp8/linear.hpp) computes its layers in float8 this way, tensor
/// parallelism (tensor_parallel.hpp) its column- and row-parallel layers. One registration of the kernels serves both.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include "../config.hpp"
#include "../compat.hpp"  // ACCEL_HAS_LINEAR_ROUTING: on a LibTorch without the key this header declares nothing

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_LINEAR_ROUTING
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <stdexcept>
#include <vector>

namespace accel::detail::routing {

/// The dispatch key the routing kernels are registered on: the autocast key of PyTorch's private-use backend, which
/// runs before every other autocast key and autograd, and on which nothing registers these operators in a CPU or
/// CUDA program. It is enabled only inside routing scopes.
inline constexpr c10::DispatchKey routing_key = c10::DispatchKey::AutocastPrivateUse1;

/// Whether `operand` is the parameter `weight` (`transposed`: `weight.t()`, what LibTorch's `F::linear` multiplies
/// by). Compared by storage, offset, sizes and strides, so that a parameter whose storage a policy swaps (a sharded
/// policy's gather, tensor parallelism's slice) is still found.
ACCEL_DECL bool is_weight(const at::Tensor& operand, const at::Tensor& weight, bool transposed);

/// How a routed product out[M, N] = x[M, K] w[N, K]ᵀ is split across a group of processes (tensor parallelism's
/// local products): each process holds a part of N (a column-parallel layer's output features) or of K (a
/// row-parallel layer's input features). A router that scales the operands (fp8) takes an amax that spans the split
/// dimension over the whole group with `max_over_group` (in place), so that every process casts with the scale of
/// the whole tensor, as one process would.
struct product_split {
  enum class dimension { output_features, input_features };
  dimension split;
  std::function<void(at::Tensor&)> max_over_group;
};

/// The layers one policy computes otherwise, found by their weight.
class linear_router {
 public:
  linear_router() = default;
  linear_router(const linear_router&) = default;
  linear_router& operator=(const linear_router&) = default;
  virtual ~linear_router() = default;
  /// The output of the layer whose weight `operand` is (`transposed`: whose `weight.t()` it is) on `input`, with
  /// `bias` added (null: none); none when `operand` is no listed layer's weight. `split`: the product is a local part
  /// of a split one (null: whole). Runs outside `routing_key`.
  [[nodiscard]] virtual std::optional<at::Tensor> route(const at::Tensor& input, const at::Tensor& operand,
                                                        bool transposed, const at::Tensor* bias,
                                                        const product_split* split) const = 0;
  /// The output of the embedding whose table `weight` is on `indices`; none when it lists no such embedding.
  [[nodiscard]] virtual std::optional<at::Tensor> route_embedding(const at::Tensor& /*weight*/,
                                                                  const at::Tensor& /*indices*/) const {
    return std::nullopt;
  }
};

/// The routers of the routing scopes alive on this thread, innermost last.
inline thread_local std::vector<const linear_router*> active_routers;

/// The output of the first router from `router` outwards (towards the scope made first) that lists the layer
/// `operand` is the weight of; none if none does.
ACCEL_DECL std::optional<at::Tensor> first_route(std::vector<const linear_router*>::reverse_iterator router,
                                                 const at::Tensor& input, const at::Tensor& operand, bool transposed,
                                                 const at::Tensor* bias, const product_split* split);

/// The first active router's output for the layer `operand` is the weight of, innermost first; none if no router
/// lists it.
ACCEL_DECL std::optional<at::Tensor> route(const at::Tensor& input, const at::Tensor& operand, bool transposed,
                                           const at::Tensor* bias);

/// `input` times `weight`ᵀ plus `bias` (null: none), a local part of a product split as `split` says, computed by the
/// first active router outside `inner` that lists `weight` (fp8 computes tensor parallelism's local products), or
/// by `at::linear` when none does. Runs outside `routing_key`, from `inner`'s `route`.
ACCEL_DECL at::Tensor linear_outside(const linear_router& inner, const at::Tensor& input, const at::Tensor& weight,
                                     const at::Tensor* bias, const product_split& split);

// What LibTorch's Linear calls (its `F::linear`): `addmm(bias, input, weight.t())` for a 2-D input with a bias, else
// `input.matmul(weight.t())` and `output += bias`; and `aten::linear` for a program that calls `torch::linear`. Each
// computes a listed layer as its router says and sends every other call on, unchanged.

ACCEL_DECL at::Tensor routed_linear(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias);

ACCEL_DECL at::Tensor routed_addmm(const at::Tensor& bias, const at::Tensor& input, const at::Tensor& weight_t,
                                   const c10::Scalar& beta, const c10::Scalar& alpha);

/// What LibTorch's Embedding calls (`F::embedding`): `aten::embedding`. A router's embedding takes no padding index,
/// gradient scaling or sparse gradient (tensor parallelism refuses such a layer when it splits it).
ACCEL_DECL at::Tensor routed_embedding(const at::Tensor& weight, const at::Tensor& indices, c10::SymInt padding_idx,
                                       bool scale_grad_by_freq, bool sparse);

ACCEL_DECL at::Tensor routed_matmul(const at::Tensor& input, const at::Tensor& weight_t);

/// Registers the routing kernels (`linear`, `addmm`, `matmul`, `embedding`; a fall-through for every other operator) on
/// `routing_key`, once per process. The registrations live as long as the process (LibTorch's own static registrations
/// do too).
ACCEL_DECL void install_routing();

/// While alive, `router`'s layers are computed as it says (on this thread); the previous routing restored after.
class [[nodiscard]] routing_scope {
 public:
  ACCEL_DECL explicit routing_scope(const linear_router& router);
  routing_scope(const routing_scope&) = delete;
  routing_scope& operator=(const routing_scope&) = delete;
  ACCEL_DECL ~routing_scope();

 private:
  bool was_included_;
  bool was_excluded_;
};

}  // namespace accel::detail::routing

#endif  // ACCEL_HAS_LINEAR_ROUTING

#if ACCEL_HEADER_ONLY
#include "impl/linear_routing.ipp"
#endif
