/// \file
/// `prepared_optimizer`: what `accelerator::prepare` returns for an optimizer. `step()` and `zero_grad()` do what
/// Accelerate's `AcceleratedOptimizer` does: nothing on micro-steps that do not synchronise gradients, and the
/// precision policy decides how to step (fp16 may skip a step on non-finite gradients).
#pragma once

#include <torch/optim/optimizer.h>

#include <concepts>
#include <memory>
#include <type_traits>

#include "detail/prepared/prepared_handle.hpp"

namespace accel {

/// An optimizer `prepare` accepts: any non-const `torch::optim::Optimizer`.
template <class O>
concept optimizer_like =
    std::derived_from<std::remove_cvref_t<O>, torch::optim::Optimizer> && !std::is_const_v<std::remove_reference_t<O>>;

/// `Optimizer` is `O&` when the user passed an lvalue (kept by reference) or `O` for an rvalue (owned).
template <class Optimizer, class Accelerator>
  requires optimizer_like<Optimizer>
class prepared_optimizer : public detail::prepared_handle<Optimizer, Accelerator> {
  using base = detail::prepared_handle<Optimizer, Accelerator>;

 public:
  using optimizer_type = typename base::object_type;

  /// The accelerator finds its optimizers (to unscale and checkpoint them) through the registration, which
  /// expires with the prepared optimizer.
  prepared_optimizer(Optimizer&& optimizer, Accelerator& accelerator)
      : base(std::forward<Optimizer>(optimizer), accelerator) {
    this->registration_ = base::access::register_optimizer(accelerator, this->unwrap());
  }

  /// Steps when gradients are synchronised; the precision policy may skip (fp16 overflow).
  void step() { base::access::step_optimizer(*this->accelerator_, this->unwrap()); }

  /// Clears gradients when they are synchronised. Like Accelerate, defaults to `set_to_none = true`.
  void zero_grad(bool set_to_none = true) {
    if (this->accelerator_->sync_gradients()) base::access::zero_grad(*this->accelerator_, this->unwrap(), set_to_none);
  }

  [[nodiscard]] auto& param_groups() const noexcept { return this->unwrap().param_groups(); }
};

}  // namespace accel
