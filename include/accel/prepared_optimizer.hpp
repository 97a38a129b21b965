/// \file
/// `prepared_optimizer`: what `accelerator::prepare` returns for an optimizer. `step()` and `zero_grad()` do what
/// Accelerate's `AcceleratedOptimizer` does: nothing on micro-steps that do not synchronise gradients, and the
/// precision policy decides how to step (fp16 may skip a step on non-finite gradients).
#pragma once

#include <torch/optim/optimizer.h>

#include <concepts>
#include <type_traits>

#include "detail/compat.hpp"
#include "detail/stored.hpp"

namespace accel {

/// An optimizer `prepare` accepts: any `torch::optim::Optimizer`.
template <class O>
concept optimizer_like = std::derived_from<std::remove_cvref_t<O>, torch::optim::Optimizer>;

/// `Optimizer` is `O&` when the user passed an lvalue (kept by reference) or `O` for an rvalue (owned).
template <class Optimizer, class Accelerator>
  requires optimizer_like<Optimizer>
class prepared_optimizer {
 public:
  using optimizer_type = std::remove_reference_t<Optimizer>;

  prepared_optimizer(Optimizer&& optimizer, Accelerator& accelerator)
      : optimizer_(std::forward<Optimizer>(optimizer)), accelerator_(&accelerator) {}

  /// Steps when gradients are synchronised; the precision policy may skip (fp16 overflow).
  void step() { accelerator_->step_optimizer(optimizer_.get()); }

  /// Clears gradients when they are synchronised. Like Accelerate, defaults to `set_to_none = true`.
  void zero_grad(bool set_to_none = true) {
    if (accelerator_->sync_gradients()) detail::compat::zero_grad(optimizer_.get(), set_to_none);
  }

  [[nodiscard]] auto& param_groups() noexcept { return optimizer_.get().param_groups(); }
  [[nodiscard]] const auto& param_groups() const noexcept { return optimizer_.get().param_groups(); }

  [[nodiscard]] optimizer_type* operator->() const noexcept { return &optimizer_.get(); }
  /// The user's optimizer.
  [[nodiscard]] optimizer_type& unwrap() const noexcept { return optimizer_.get(); }

 private:
  mutable detail::stored<Optimizer> optimizer_;
  Accelerator* accelerator_;
};

}  // namespace accel
