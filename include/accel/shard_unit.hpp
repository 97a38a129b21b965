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
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <memory>
#include <ostream>
#include <type_traits>
#include <utility>

#include "detail/tensor_structure.hpp"
#include "prepared_model.hpp"

namespace accel {
namespace detail {

/// What a policy that shards parameters does around a unit (sharded_data_parallel at stage 3, unit_schedule.hpp).
class unit_hooks {
 public:
  /// Before the unit's forward: its parameters whole.
  virtual void before_unit_forward(std::size_t unit) = 0;
  /// After it. `backward_hooked`: the gather before the unit's backward hangs on its outputs (or no backward can
  /// come), so that its parameters may go until then.
  virtual void after_unit_forward(std::size_t unit, bool backward_hooked) = 0;
  /// When the gradient of one of the unit's outputs arrives, before the unit's own backward.
  virtual void before_unit_backward(std::size_t unit) = 0;

 protected:
  ~unit_hooks() = default;
};

/// What every `shard_unit_impl<M>` is to a policy, whatever it wraps: found by walking a prepared model's modules.
class shard_unit_base {
 public:
  /// At prepare: the policy's hooks and this unit's number among them. A unit without hooks, or whose hooks are
  /// gone (the accelerator destroyed, `free_memory`), only forwards.
  void attach(std::weak_ptr<unit_hooks> hooks, std::size_t index) noexcept {
    hooks_ = std::move(hooks);
    index_ = index;
  }

 protected:
  shard_unit_base() = default;
  ~shard_unit_base() = default;

  /// `forward()` between the policy's hooks; the gather before backward is hooked on every output tensor that
  /// requires a gradient (outputs that are not tensors, or nested structures of them, cannot be hooked).
  template <class Forward>
  auto forward_between_hooks(Forward&& forward) {
    const auto hooks = hooks_.lock();
    if (!hooks) return std::forward<Forward>(forward)();
    hooks->before_unit_forward(index_);
    auto output = std::forward<Forward>(forward)();
    hooks->after_unit_forward(index_, hook_backward(output));
    return output;
  }

 private:
  template <class Output>
  bool hook_backward(const Output& output) const {
    if constexpr (is_tensor_structure<Output>) {
      auto hook = [hooks = hooks_, index = index_](const at::Tensor& tensor) {
        if (tensor.defined() && tensor.requires_grad())
          tensor.register_hook([hooks, index](const at::Tensor&) {
            if (const auto alive = hooks.lock()) alive->before_unit_backward(index);
          });
        return tensor;
      };
      map_tensors(output, hook);
      return true;  // hooked, or no output requires a gradient: no backward reaches the unit through them
    } else {
      return false;
    }
  }

  std::weak_ptr<unit_hooks> hooks_;
  std::size_t index_ = 0;
};

/// The signature of a module's `forward` when it has exactly one that is not a template (`void()` otherwise):
/// the wrapper then has that same forward, so that `torch::nn::Sequential`, `AnyModule` and ModuleHolder's call
/// operator, which look for one, take a unit as they take the module it wraps.
template <class F>
struct member_signature {
  using type = void();
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
  using type = void();
};
template <class Impl>
struct forward_signature<Impl, std::void_t<decltype(&Impl::forward)>> : member_signature<decltype(&Impl::forward)> {};

/// A unit's `forward`: with the wrapped module's signature where there is one, else a template.
template <class Unit, class Signature>
class unit_forward {
 public:
  template <class... Args>
  auto forward(Args&&... args) {
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
  explicit shard_unit_impl(Wrapped module) : module_(std::move(module)) {
    auto& wrapped = *detail::module_pointer(module_);
    for (auto& item : wrapped.named_parameters(/*recurse=*/false))
      register_parameter(item.key(), item.value(), item.value().requires_grad());
    for (auto& item : wrapped.named_buffers(/*recurse=*/false)) register_buffer(item.key(), item.value());
    for (auto& item : wrapped.named_children()) register_module(item.key(), item.value());
  }

  /// The wrapped module's forward, its parameters whole for it: what `forward` (detail::unit_forward) calls.
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
    return this->ptr()->forward(std::forward<Args>(args)...);
  }
};
template <model_like Wrapped>
shard_unit(Wrapped) -> shard_unit<Wrapped>;

}  // namespace accel
