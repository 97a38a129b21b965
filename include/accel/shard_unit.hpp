/// \file
/// `accel::shard_unit(module)`: a unit of `accel::fully_sharded`, the part of a model whose parameters it gathers
/// and lets go together (an FSDP unit). Wrap the blocks of a model where you register them:
///
///     block1 = register_module("block1", accel::shard_unit(Block(512)));
///
/// Under `fully_sharded`, a unit's parameters are all-gathered just before its forward (while the previous unit
/// computes, when prefetched), freed after it (`options::sharding.reshard_after_forward`), gathered again before its
/// backward and freed once it is over: a process then holds the parameters outside any unit and those of at most
/// two units at once, instead of the whole model. Under every other policy the wrapper only forwards.
///
/// The wrapper registers the wrapped module's parameters, buffers and submodules as its own, so that their names
/// stay the wrapped module's (`block1.attn.weight`, not `block1.module.attn.weight`): checkpoints, `named_parameters`
/// and `get_state_dict` read the same with or without units. `unit->module()` is the wrapped module.
///
/// A unit is called as the module it wraps: `block(x)`. It has the wrapped module's `forward` signature when the
/// module has exactly one `forward` that is not a template, so that it also fits in a `torch::nn::Sequential`;
/// around a module whose `forward` is a template (a `torch::nn::Sequential`) or overloaded, its `forward` is a
/// template taking what the module's takes: call it directly (a Sequential or AnyModule holding it would need one
/// signature). Arguments the wrapped module's forward does not take are a compile error saying so.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <memory>
#include <ostream>
#include <type_traits>
#include <utility>

#include "detail/sharding/unit_hooks.hpp"
#include "prepared_model.hpp"

namespace accel {
namespace detail {

/// What `forward_signature` gives for a module without exactly one `forward` that is not a template (a template, as
/// `torch::nn::Sequential`'s, overloads, or none): the unit's forward is then a template too.
struct no_single_forward {};

/// The signature of a module's `forward` when it has exactly one that is not a template (`no_single_forward`
/// otherwise): the wrapper then has that same forward, so that `torch::nn::Sequential`, `AnyModule` and
/// ModuleHolder's call operator, which look for one, take a unit as they take the module it wraps.
template <class F>
struct member_signature {
  using type = no_single_forward;
};
template <class R, class C, class... A>
struct member_signature<R (C::*)(A...)> {
  using type = R(A...);
};
template <class R, class C, class... A>
struct member_signature<R (C::*)(A...) const> {
  using type = R(A...);
};
template <class Impl, class = void>
struct forward_signature {
  using type = no_single_forward;
};
template <class Impl>
struct forward_signature<Impl, std::void_t<decltype(&Impl::forward)>> : member_signature<decltype(&Impl::forward)> {};

/// Whether the module `Wrapped` holds has a `forward` that takes `Args`.
template <class Wrapped, class... Args>
concept forward_takes =
    requires(Wrapped& module, Args&&... args) { module_pointer(module)->forward(std::forward<Args>(args)...); };

/// A unit's `forward`: with the wrapped module's signature where there is one, else a template that takes what the
/// wrapped module's forward takes (a template forward, overloads).
template <class Unit, class Signature>
class unit_forward {
 public:
  template <class... Args>
  auto forward(Args&&... args) {
    static_assert(forward_takes<typename Unit::wrapped_type, Args...>,
                  "accel::shard_unit: the wrapped module has no forward that takes these arguments (or none at all, "
                  "as a ModuleList): call the unit as you would call the module it wraps");
    return static_cast<Unit&>(*this).forward_wrapped(std::forward<Args>(args)...);
  }
};
template <class Unit, class R, class... A>
class unit_forward<Unit, R(A...)> {
 public:
  R forward(A... args) { return static_cast<Unit&>(*this).forward_wrapped(std::forward<A>(args)...); }
};

}  // namespace detail

/// The module `accel::shard_unit` holds: `Wrapped` (a ModuleHolder such as `torch::nn::Linear`, or a
/// `std::shared_ptr` to a module) whose forward runs between the policy's hooks.
template <model_like Wrapped>
class shard_unit_impl
    : public torch::nn::Module,
      public detail::shard_unit_base,
      public detail::unit_forward<
          shard_unit_impl<Wrapped>,
          typename detail::forward_signature<std::remove_cvref_t<decltype(*std::declval<Wrapped&>())>>::type> {
 public:
  using wrapped_type = Wrapped;

  /// The unit is named as the module it wraps (`Module::name()`), so that `no_split_module_classes` and messages
  /// name the user's class, not this wrapper's.
  explicit shard_unit_impl(Wrapped module)
      : torch::nn::Module(detail::module_pointer(module)->name()), module_(std::move(module)) {
    auto& wrapped = *detail::module_pointer(module_);
    for (auto& item : wrapped.named_parameters(/*recurse=*/false))
      register_parameter(item.key(), item.value(), item.value().requires_grad());
    for (auto& item : wrapped.named_buffers(/*recurse=*/false)) register_buffer(item.key(), item.value());
    for (auto& item : wrapped.named_children()) register_module(item.key(), item.value());
    slice_if_constructing(wrapped);
  }

  /// The wrapped module's forward, its parameters full for it: what `forward` (detail::unit_forward) calls.
  template <class... Args>
  auto forward_wrapped(Args&&... args) {
    return forward_between_hooks([&] { return detail::module_pointer(module_)->forward(std::forward<Args>(args)...); });
  }

  /// The wrapped module, as given.
  [[nodiscard]] const Wrapped& module() const noexcept { return module_; }

  /// The wrapped module follows: it is not one of the wrapper's children (its own are).
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    detail::module_pointer(module_)->train(on);
  }
  void pretty_print(std::ostream& stream) const override {
    stream << "accel::shard_unit(";
    detail::module_pointer(module_)->pretty_print(stream);
    stream << ")";
  }

 private:
  Wrapped module_;
};

/// `accel::shard_unit(module)`: a handle to a `shard_unit_impl`, as `torch::nn::Linear` is to a `LinearImpl`.
template <model_like Wrapped>
class shard_unit : public torch::nn::ModuleHolder<shard_unit_impl<Wrapped>> {
 public:
  using torch::nn::ModuleHolder<shard_unit_impl<Wrapped>>::ModuleHolder;
  /// The wrapped module's forward (ModuleHolder's own call operator cannot see a forward that is a template).
  template <class... Args>
  auto operator()(Args&&... args) const {
    static_assert(detail::forward_takes<Wrapped, Args...>,
                  "accel::shard_unit: the wrapped module has no forward that takes these arguments (or none at all, "
                  "as a ModuleList): call the unit as you would call the module it wraps");
    return this->ptr()->forward(std::forward<Args>(args)...);
  }
};
template <model_like Wrapped>
shard_unit(Wrapped) -> shard_unit<Wrapped>;

}  // namespace accel
