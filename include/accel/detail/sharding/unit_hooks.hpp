/// \file
/// What a policy that gathers parameters per `accel::shard_unit` sees of a unit, and what a unit calls on such a
/// policy: the seam between the public wrapper (shard_unit.hpp) and the schedule (unit_schedule.hpp), so that
/// neither includes the other.
// IWYU pragma: private, include <accel/shard_unit.hpp>
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../support/tensor_structure.hpp"
#include "construction.hpp"

namespace accel::detail {

/// What a policy that shards parameters does around a unit (fully_sharded: unit_schedule.hpp).
class unit_hooks {
 public:
  /// Before the unit's forward: its parameters full.
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
  ACCEL_DECL void attach(std::weak_ptr<unit_hooks> hooks, std::size_t index) noexcept;
  /// At prepare: the slices a sharded construction kept of this unit's parameters (none when it was built whole),
  /// handed over once.
  [[nodiscard]] std::vector<constructed_slice> take_constructed_slices() noexcept {
    return std::exchange(constructed_, {});
  }

 protected:
  shard_unit_base() = default;
  ~shard_unit_base() = default;

  /// Once the unit is built: inside a sharded construction (construction.hpp), keeps this process's slices of
  /// `module`'s parameters and lets the whole ones go.
  ACCEL_DECL void slice_if_constructing(torch::nn::Module& module);

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
  std::vector<constructed_slice> constructed_;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/unit_hooks.ipp"
#endif
