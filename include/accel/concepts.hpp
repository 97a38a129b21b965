/// \file
/// The policy concepts and the adapter concepts used by `accelerator::prepare`.
///
/// Customisation points (every one accel has):
/// - a precision policy:    `using policy_category = accel::precision_tag;`, the required hooks of
///                          `detail::precision_hooks` below, and those of `detail::precision_defaulted_hooks`
///                          (derive from `accel::precision_defaults` and redefine what differs);
/// - a parallel policy:     `parallel_tag` and the facets below (`detail::process_topology`, `model_preparation`,
///                          `gradient_synchronisation`, `optimizer_stepping`, `checkpoint_participation`, and
///                          `uneven_inputs` where it declares `joins_uneven_inputs`), the defaulted hooks and the
///                          capabilities from `accel::parallel_defaults`;
/// - an accumulation policy:likewise `accumulation_tag`, `detail::accumulation_hooks`, `accel::accumulation_defaults`;
/// - any policy with state: `save_state(archive) const` and `load_state(archive)` (`detail::stateful_policy`),
///                          saved in every checkpoint;
/// - a batch type:          specialise `accel::batch_traits<T>` (device.hpp) to move a user type to a device.
///
/// The header names LibTorch types only in declarations, so it stays cheap to include; the hooks are checked
/// where the accelerator is named, by which time the policies' own headers have included LibTorch.
#pragma once

#include <concepts>
#include <memory>
#include <string_view>
#include <vector>
#include <type_traits>

#include "detail/support/diagnostics.hpp"
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
namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace accel {
namespace detail {
class parameter_encoding;  // detail/support/parameter_encoding.hpp

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

/// A policy with checkpointed state of its own (fp16's loss scale, the micro-step count): optional on any policy.
/// `save_state` writes its keys into every process's `random_states_{rank}.bin`; `load_state` reads everything it
/// needs before changing anything and throws `accel::checkpoint_error` naming what is missing.
template <class P>
concept stateful_policy =
    requires(const P& saving, P& loading, torch::serialize::OutputArchive& out, torch::serialize::InputArchive& in) {
      saving.save_state(out);
      loading.load_state(in);
    };
// clang-format off: the message stays on one line (see below).
/// A policy that declares either state hook has both, with those signatures (else they would be silently skipped).
template <class P>
concept well_formed_state_hooks =
    stateful_policy<P> || (!requires { &P::save_state; } && !requires { &P::load_state; }) ||
    unsatisfied<"this policy declares save_state or load_state, but not as save_state(torch::serialize::OutputArchive&) const and load_state(torch::serialize::InputArchive&): see accel/concepts.hpp", P>();
// clang-format on

/// What the accelerator calls on its precision policy: the required hooks...
template <class P>
concept precision_hooks = std::constructible_from<P, const options&, const c10::Device&> &&
                          requires(const P& cp, const at::Tensor& loss, const c10::Device& device) {
                            cp.forward_scope(device);  // RAII object alive during the model's forward
                            cp.forward_output(loss);   // what the model's forward returns (bf16/fp16: float32)
                          };
/// ...and those `accel::precision_defaults` provides (precision.hpp), which a policy may redefine.
template <class P>
concept precision_defaulted_hooks = requires(P& p, const P& cp, const at::Tensor& loss, torch::optim::Optimizer& opt,
                                             torch::nn::Module& module, single_process& parallel) {
  { P::name() } -> std::convertible_to<std::string_view>;
  { P::mixed_precision() } -> std::convertible_to<std::string_view>;  // what selects it in accel::dispatch
  p.prepare_model(module);   // at prepare, before the parallel policy sees the model
  cp.gather_encoding();      // at prepare: how a sharded policy may gather some parameters (fp8: in float8)
  p.backward(loss);          // runs backward (fp16 scales the loss first)
  p.unscale(opt, parallel);  // divides the optimizer's gradients by the loss scale, once per step
  p.step(opt, parallel);     // decides whether to step (fp16 may skip); the parallel policy steps
  { cp.step_was_skipped() } -> std::convertible_to<bool>;
  { cp.loss_scale() } -> std::convertible_to<double>;  // what gradients are multiplied by until unscaled
};

// The parallel seam, as facets by purpose. Each facet's hooks are written once, here, one per line with what it is
// for; docs/architecture.md's facet tables and each facet's message below list the same names, which
// `docs.parallel_facets` checks. A facet marked "defaults" takes every hook it lacks from `accel::parallel_defaults`
// (parallel.hpp), which holds what replicated data parallelism does.

/// \facet process topology (required): which processes exist, where this one computes, what collectives run on.
template <class Q>
concept process_topology = std::constructible_from<Q, const options&> && requires(Q& q, const Q& cq) {
  { cq.device() } -> std::convertible_to<const c10::Device&>;  // acc.device(), the precision policy's constructor
  { cq.process_index() } -> std::convertible_to<int>;          // the process queries, sharding, file names
  { cq.local_process_index() } -> std::convertible_to<int>;    // this machine's processes
  { cq.num_processes() } -> std::convertible_to<int>;          // a static constexpr 1: no sharding at all
  q.wait_for_everyone();                                       // acc.wait_for_everyone(), main_process_first
  q.communicator();                                            // every collective (accel/collectives.hpp)
};

/// \facet model preparation: what happens to a prepared model, at prepare and before each forward.
template <class Q>
concept model_preparation =
    requires(Q& q, torch::nn::Module& module, const std::shared_ptr<parameter_encoding>& encoding) {
      q.prepare_model(module);          // prepare(model): broadcast, gradient hooks, shards
      q.before_forward(module);         // each forward of a prepared model: arm gradient hooks, sync buffers, gather
      q.release_models();               // defaults: free_memory forgets every prepared model
      q.use_gather_encoding(encoding);  // defaults: at prepare, the precision policy's encoding of gathered parameters
      q.forward_scope();                // defaults: alive around each forward (tensor_parallel routes its layers)
    };

/// \facet gradient synchronisation (required): whether backward communicates gradients.
template <class Q>
concept gradient_synchronisation = requires(Q& q, const Q& cq, torch::nn::Module& module) {
  { cq.gradient_sync(module) } -> std::convertible_to<bool>;  // accumulate, no_sync
  q.set_gradient_sync(module, true, false);  // enabled, this_backward: no_sync, accumulation, trigger_sync_in_backward
};

/// \facet optimizer stepping (defaults): how a prepared optimizer steps, and the checks that span processes.
template <class Q>
concept optimizer_stepping = requires(Q& q, torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params) {
  q.prepare_optimizer(opt);                                         // prepare(optimizer): a sharded policy splits it
  q.attach_gradients(opt);                                          // before unscale, clip and step read gradients
  q.step_optimizer(opt);                                            // the step (a sharded one steps its shard)
  q.zero_grad(opt, true);                                           // prepared_optimizer::zero_grad(set_to_none)
  { q.any_non_finite(true) } -> std::convertible_to<bool>;          // every process's verdict on inf/NaN
  { q.gradient_norm(params, 2.0) } -> std::convertible_to<double>;  // the norm over every process's part
  { q.clip_grad_norm(params, 1.0, 2.0) } -> std::convertible_to<double>;  // clip_grad_norm_
};

/// \facet checkpoint participation (defaults): what a checkpoint reads and writes of the parallel state.
template <class Q>
concept checkpoint_participation =
    requires(Q& q, torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params, torch::nn::Module& module) {
      { q.checkpoint_format() } -> std::convertible_to<state_dict_type>;  // what save_state writes
      q.with_full_parameters(module, [] {});                              // the weights full for the while
      q.with_parameters_at_rest(module, [] {});  // the weights as kept between steps (a rank-local load's target)
      { q.full_parameter(params.front()) } -> std::convertible_to<at::Tensor>;  // get_state_dict, one at a time
      q.with_full_optimizer_state(opt, [] {});  // save_state: the optimizer holding the job's full state for the while
      q.load_full_optimizer_state(opt, [] {});  // load_state: a full state loaded, the policy keeps its part
      q.shard_of(params.front());               // a sharded checkpoint's part of a parameter
    };

/// \facet uneven inputs (declared): join_uneven_inputs, for a policy with `joins_uneven_inputs = true`.
template <class Q>
concept uneven_inputs = requires(Q& q, const std::vector<const torch::nn::Module*>& modules) {
  q.begin_join(modules);                            // the join starts: forwards announce themselves
  { q.finish_join() } -> std::convertible_to<int>;  // this process ran out of data: the last process to finish
  { q.abandon_join() } noexcept;                    // an exception left the scope: forget the join
};

/// The capabilities a parallel policy declares (`parallel_defaults` gives replicated data parallelism's), read
/// instead of probing the policy or naming it.
template <class Q>
concept declares_capabilities = requires {
  { Q::name() } -> std::convertible_to<std::string_view>;               // messages, dispatch's list
  { Q::distributed_type() } -> std::convertible_to<std::string_view>;   // what selects it in accel::dispatch
  requires std::same_as<decltype(Q::joins_uneven_inputs), const bool>;  // has the uneven inputs facet
  requires std::same_as<decltype(Q::steps_alone), const bool>;          // each process can step its whole model alone
  requires std::same_as<decltype(Q::keeps_parameter_slices), const bool>;  // only its slices of the parameters
};

/// What the accelerator calls on its accumulation policy: the required hooks...
template <class A>
concept accumulation_hooks =
    std::constructible_from<A, const options&> && requires(A& a, const A& ca, const at::Tensor& loss) {
      { ca.steps() } -> std::convertible_to<int>;
      a.begin_micro_step(true);  // entering acc.accumulate(model); true on a prepared range's last batch
      { ca.step() } -> std::convertible_to<int>;
      { ca.sync_gradients() } -> std::convertible_to<bool>;
      ca.scale_loss(loss);
    };
/// ...and those `accel::accumulation_defaults` provides (accumulation.hpp).
template <class A>
concept accumulation_defaulted_hooks = requires(A& a) {
  { A::name() } -> std::convertible_to<std::string_view>;
  a.restart();  // free_memory: the count starts again
};

}  // namespace detail

// clang-format off: the compiler quotes the failing constraint's source, so each message stays on one line.
/// A precision policy: `accel::fp32`, `accel::bf16` or `accel::fp16`.
template <class P>
concept precision_policy =
    (detail::has_category<P, precision_tag> ||
     detail::unsatisfied<"accel::accelerator's 1st argument must be a precision policy: accel::fp32, accel::bf16 or accel::fp16", P>()) &&
    (detail::precision_hooks<P> ||
     detail::unsatisfied<"this precision policy lacks a constructor from (accel::options, c10::Device), forward_scope(device) or forward_output(output): see accel/concepts.hpp", P>()) &&
    (detail::precision_defaulted_hooks<P> ||
     detail::unsatisfied<"this precision policy lacks name(), mixed_precision(), prepare_model(module), gather_encoding(), backward(loss), unscale(optimizer, parallel), step(optimizer, parallel), step_was_skipped() or loss_scale(): derive it from accel::precision_defaults", P>()) &&
    detail::well_formed_state_hooks<P>;

/// A parallel policy: `accel::single_process`, `accel::data_parallel<Backend>`, `accel::zero1<Backend>`,
/// `accel::zero2<Backend>` or `accel::fully_sharded<Backend>`; or one of yours, written against the facets above.
template <class Q>
concept parallel_policy =
    (detail::has_category<Q, parallel_tag> ||
     detail::unsatisfied<"accel::accelerator's 2nd argument must be a parallel policy: accel::single_process, accel::data_parallel<accel::gloo or accel::nccl>, accel::zero1, accel::zero2 or accel::fully_sharded", Q>()) &&
    (detail::process_topology<Q> ||
     detail::unsatisfied<"this parallel policy lacks a hook of the process topology facet: a constructor from accel::options, device(), process_index(), local_process_index(), num_processes(), wait_for_everyone() or communicator(): see accel/concepts.hpp", Q>()) &&
    (detail::model_preparation<Q> ||
     detail::unsatisfied<"this parallel policy lacks a hook of the model preparation facet: prepare_model(module), before_forward(module), release_models(), use_gather_encoding(encoding) or forward_scope(): see accel/concepts.hpp", Q>()) &&
    (detail::gradient_synchronisation<Q> ||
     detail::unsatisfied<"this parallel policy lacks a hook of the gradient synchronisation facet: gradient_sync(module) or set_gradient_sync(module, bool enabled, bool this_backward): see accel/concepts.hpp", Q>()) &&
    (detail::optimizer_stepping<Q> ||
     detail::unsatisfied<"this parallel policy lacks a hook of the optimizer stepping facet: prepare_optimizer(optimizer), attach_gradients(optimizer), step_optimizer(optimizer), zero_grad(optimizer, set_to_none), any_non_finite(bool), gradient_norm(parameters, norm_type) or clip_grad_norm(parameters, max_norm, norm_type): derive it from accel::parallel_defaults", Q>()) &&
    (detail::checkpoint_participation<Q> ||
     detail::unsatisfied<"this parallel policy lacks a hook of the checkpoint participation facet: checkpoint_format(), with_full_parameters(module, action), with_parameters_at_rest(module, action), full_parameter(parameter), with_full_optimizer_state(optimizer, write), load_full_optimizer_state(optimizer, load) or shard_of(parameter): derive it from accel::parallel_defaults", Q>()) &&
    (detail::declares_capabilities<Q> ||
     detail::unsatisfied<"this parallel policy lacks name(), distributed_type() or its capabilities (static constexpr bool joins_uneven_inputs, steps_alone, keeps_parameter_slices): derive it from accel::parallel_defaults", Q>()) &&
    (!detail::declares_capabilities<Q> || !Q::joins_uneven_inputs || detail::uneven_inputs<Q> ||
     detail::unsatisfied<"this parallel policy declares joins_uneven_inputs but lacks a hook of the uneven inputs facet: begin_join(modules), finish_join() or abandon_join() noexcept: see accel/concepts.hpp", Q>()) &&
    detail::well_formed_state_hooks<Q>;

/// An accumulation policy: `accel::no_accumulation`, `accel::accumulate<N>` or `accel::accumulate_dynamic`.
template <class A>
concept accumulation_policy =
    (detail::has_category<A, accumulation_tag> ||
     detail::unsatisfied<"accel::accelerator's 3rd argument must be an accumulation policy: accel::no_accumulation, accel::accumulate<N> or accel::accumulate_dynamic", A>()) &&
    (detail::accumulation_hooks<A> ||
     detail::unsatisfied<"this accumulation policy lacks a constructor from accel::options, steps(), begin_micro_step(bool), step(), sync_gradients() or scale_loss(loss): see accel/concepts.hpp", A>()) &&
    (detail::accumulation_defaulted_hooks<A> ||
     detail::unsatisfied<"this accumulation policy lacks name() or restart(): derive it from accel::accumulation_defaults", A>()) &&
    detail::well_formed_state_hooks<A>;

/// A communication backend for `accel::data_parallel`: `accel::gloo` or `accel::nccl`.
template <class B>
concept communication_backend =
    detail::has_category<B, backend_tag> ||
    detail::unsatisfied<"accel::data_parallel<Backend> takes accel::gloo (CPU) or accel::nccl (CUDA) as its backend", B>();
// clang-format on

}  // namespace accel
