/// \file
/// `prepared_scheduler`: what `accelerator::prepare` returns for a learning-rate scheduler. It follows
/// Accelerate's `AcceleratedScheduler`: it steps only when the optimizer really stepped (not on accumulation
/// micro-steps, not on an fp16-skipped step), and `num_processes()` times per optimizer step, so that a schedule
/// written for one process ends at the same place on P processes.
#pragma once

#include <type_traits>
#include <utility>

#include "detail/stored.hpp"
#include "prepared_optimizer.hpp"

namespace accel {

/// A scheduler `prepare` accepts: anything with `step()` (`torch::optim::LRScheduler` and its subclasses) or
/// `step(metric)` (2.x's `ReduceLROnPlateauScheduler`) that is not itself an optimizer.
template <class S>
concept scheduler_like =
    !optimizer_like<S> &&
    (requires(std::remove_cvref_t<S>& s) { s.step(); } || requires(std::remove_cvref_t<S>& s, float metric) {
      s.step(metric);
    });

template <class Scheduler, class Accelerator>
  requires scheduler_like<Scheduler>
class prepared_scheduler {
 public:
  using scheduler_type = std::remove_reference_t<Scheduler>;

  prepared_scheduler(Scheduler&& scheduler, Accelerator& accelerator)
      : scheduler_(std::forward<Scheduler>(scheduler)), accelerator_(&accelerator) {}

  /// `step()` or `step(metric)`, forwarded to the user's scheduler when the optimizer stepped.
  template <class... Args>
  void step(Args&&... args) {
    if (!accelerator_->sync_gradients() || accelerator_->optimizer_step_was_skipped()) return;
    for (int i = 0; i < accelerator_->num_processes(); ++i) scheduler_.get().step(args...);
  }

  [[nodiscard]] scheduler_type* operator->() const noexcept { return &scheduler_.get(); }
  /// The user's scheduler.
  [[nodiscard]] scheduler_type& unwrap() const noexcept { return scheduler_.get(); }

 private:
  mutable detail::stored<Scheduler> scheduler_;
  Accelerator* accelerator_;
};

}  // namespace accel
