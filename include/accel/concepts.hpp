/// \file
/// The policy concepts and the adapter concepts used by `accelerator::prepare`.
///
/// Customisation points (every one accel has):
/// - a precision policy:    `using policy_category = accel::precision_tag;` plus the hooks of
///                          `detail::precision_hooks` below (see precision.hpp for the three built-in ones);
/// - a parallel policy:     `using policy_category = accel::parallel_tag;` plus `detail::parallel_hooks`;
/// - an accumulation policy:`using policy_category = accel::accumulation_tag;` plus `detail::accumulation_hooks`;
/// - a batch type:          specialise `accel::batch_traits<T>` (device.hpp) to move a user type to a device.
///
/// The header names LibTorch types only in declarations, so it stays cheap to include; the hooks are checked
/// where the accelerator is named, by which time the policies' own headers have included LibTorch.
#pragma once

#include <concepts>
#include <type_traits>

#include "detail/diagnostics.hpp"
#include "fwd.hpp"

namespace c10 {
struct Device;
}
namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}
namespace torch::nn {
class Module;
}

namespace accel {
namespace detail {

template <class T>
struct category_of {
  using type = void;
};
template <class T>
  requires requires { typename T::policy_category; }
struct category_of<T> {
  using type = typename T::policy_category;
};

/// True when `T` opted into the family `Tag`.
template <class T, class Tag>
concept has_category = std::same_as<typename category_of<std::remove_cvref_t<T>>::type, Tag>;

/// What the accelerator calls on its precision policy.
template <class P>
concept precision_hooks = std::constructible_from<P, const options&, const c10::Device&> && requires(P& p, const P& cp, const at::Tensor& loss, torch::optim::Optimizer& opt,
                                   const c10::Device& device) {
  cp.forward_scope(device);      // RAII object alive during the model's forward
  cp.forward_output(loss);       // what the model's forward returns (bf16/fp16: back to float32)
  p.backward(loss);              // runs backward (fp16 scales the loss first)
  p.unscale(opt);                // divides the optimizer's gradients by the loss scale, once per step
  p.step(opt);                   // steps the optimizer (fp16 may skip)
  { cp.step_was_skipped() } -> std::convertible_to<bool>;
  { cp.loss_scale() } -> std::convertible_to<double>;  // what gradients are multiplied by until unscaled
};

/// What the accelerator calls on its parallel policy.
template <class Q>
concept parallel_hooks = std::constructible_from<Q, const options&> && requires(Q& q, const Q& cq, torch::nn::Module& module) {
  { cq.device() } -> std::convertible_to<const c10::Device&>;
  { cq.process_index() } -> std::convertible_to<int>;
  { cq.local_process_index() } -> std::convertible_to<int>;
  { cq.num_processes() } -> std::convertible_to<int>;
  q.wait_for_everyone();
  q.prepare_model(module);       // broadcast parameters, register gradient hooks (data parallel)
  { cq.gradient_sync(module) } -> std::convertible_to<bool>;
  q.set_gradient_sync(module, true, false);  // enabled, this_backward: no_sync, accumulation, trigger_sync_in_backward
  q.before_forward(module);      // each forward of a prepared model: arm gradient hooks, sync buffers
  q.communicator();              // what the collectives run on (accel/collectives.hpp)
};

/// What the accelerator calls on its accumulation policy.
template <class A>
concept accumulation_hooks = std::constructible_from<A, const options&> && requires(A& a, const A& ca, const at::Tensor& loss) {
  { ca.steps() } -> std::convertible_to<int>;
  a.begin_micro_step(true);      // entering acc.accumulate(model); true on a prepared range's last batch
  { ca.step() } -> std::convertible_to<int>;
  { ca.sync_gradients() } -> std::convertible_to<bool>;
  ca.scale_loss(loss);
};

}  // namespace detail

/// A precision policy: `accel::fp32`, `accel::bf16` or `accel::fp16`.
template <class P>
concept precision_policy =
    (detail::has_category<P, precision_tag> ||
     detail::unsatisfied<"accel::accelerator's 1st argument must be a precision policy: accel::fp32, accel::bf16 or accel::fp16", P>()) &&
    (detail::precision_hooks<P> ||
     detail::unsatisfied<"this precision policy lacks a constructor from (accel::options, c10::Device), forward_scope(device), forward_output(output), backward(loss), unscale(optimizer), step(optimizer), step_was_skipped() or loss_scale(): see accel/concepts.hpp", P>());

/// A parallel policy: `accel::single_process` or `accel::data_parallel<accel::gloo / accel::nccl>`.
template <class Q>
concept parallel_policy =
    (detail::has_category<Q, parallel_tag> ||
     detail::unsatisfied<"accel::accelerator's 2nd argument must be a parallel policy: accel::single_process or accel::data_parallel<accel::gloo or accel::nccl>", Q>()) &&
    (detail::parallel_hooks<Q> ||
     detail::unsatisfied<"this parallel policy lacks a constructor from accel::options, device(), process_index(), local_process_index(), num_processes(), wait_for_everyone(), prepare_model(module), gradient_sync(module), set_gradient_sync(module, bool enabled, bool this_backward), before_forward(module) or communicator(): see accel/concepts.hpp", Q>());

/// An accumulation policy: `accel::no_accumulation`, `accel::accumulate<N>` or `accel::accumulate_dynamic`.
template <class A>
concept accumulation_policy =
    (detail::has_category<A, accumulation_tag> ||
     detail::unsatisfied<"accel::accelerator's 3rd argument must be an accumulation policy: accel::no_accumulation, accel::accumulate<N> or accel::accumulate_dynamic", A>()) &&
    (detail::accumulation_hooks<A> ||
     detail::unsatisfied<"this accumulation policy lacks a constructor from accel::options, steps(), begin_micro_step(bool), step(), sync_gradients() or scale_loss(loss): see accel/concepts.hpp", A>());

/// A communication backend for `accel::data_parallel`: `accel::gloo` or `accel::nccl`.
template <class B>
concept communication_backend =
    detail::has_category<B, backend_tag> ||
    detail::unsatisfied<"accel::data_parallel<Backend> takes accel::gloo (CPU) or accel::nccl (CUDA) as its backend", B>();

}  // namespace accel
