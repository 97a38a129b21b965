/// \file
/// `prepared_scheduler`: what `accelerator::prepare` returns for a learning-rate scheduler. It follows
/// Accelerate's `AcceleratedScheduler`: it steps only when the optimizer really stepped (not on accumulation
/// micro-steps, not on an fp16-skipped step), and `num_processes()` times per optimizer step (once with
/// `split_batches`), so that a schedule written for one process ends at the same place on P processes.
#pragma once

#include <type_traits>
#include <utility>

#include <memory>

#include "detail/checkpoint/slot.hpp"
#include "detail/prepared/prepared_handle.hpp"
#include "prepared_optimizer.hpp"

namespace accel {

/// A scheduler `prepare` accepts: anything with `step()` (`torch::optim::LRScheduler` and its subclasses) or
/// `step(metric)` (2.x's `ReduceLROnPlateauScheduler`) that is neither an optimizer nor already prepared.
template <class S>
concept scheduler_like =
    !optimizer_like<S> && !detail::is_prepared<S> &&
    (requires(std::remove_reference_t<S>& s) { s.step(); } ||
     requires(std::remove_reference_t<S>& s, float metric) { s.step(metric); });

template <class Scheduler, class Accelerator>
  requires scheduler_like<Scheduler>
class prepared_scheduler : public detail::prepared_handle<Scheduler, Accelerator> {
  using base = detail::prepared_handle<Scheduler, Accelerator>;

 public:
  using scheduler_type = typename base::object_type;

  prepared_scheduler(Scheduler&& scheduler, Accelerator& accelerator)
      : base(std::forward<Scheduler>(scheduler), accelerator) {
    this->registration_ = base::access::register_state(
        accelerator, detail::slot_for(detail::checkpoint_files::kind::scheduler, this->unwrap()));
  }

  /// `step()` or `step(metric)`, forwarded to the user's scheduler when the optimizer stepped.
  /// With `options::step_scheduler_with_optimizer` off, every call steps once.
  template <class... Args>
  void step(const Args&... args) {
    const auto& accelerator = *this->accelerator_;
    if (!accelerator.step_scheduler_with_optimizer()) {
      this->unwrap().step(args...);
      return;
    }
    if (!accelerator.sync_gradients() || accelerator.optimizer_step_was_skipped()) return;
    // A schedule written for one process of batch B ends at the same place on P processes of batch B each,
    // which see P times fewer steps; with split batches each step is the same global batch.
    const int times = accelerator.split_batches() ? 1 : accelerator.num_processes();
    for (int i = 0; i < times; ++i) this->unwrap().step(args...);
  }
};

}  // namespace accel
