/// \file
/// `deferred_trackers`: the accelerator's trackers, made by the first tracking call. Their type is complete only
/// where accel/tracking.hpp is included, so what the accelerator does with them later (finish them, log a straggler
/// verdict) is recorded then, in two function pointers, and the accelerator's own code never needs the type.
// IWYU pragma: private, include <accel/accelerator.hpp>
#pragma once

#include <cstdint>
#include <memory>

#include "../support/deferred.hpp"
#include "../support/straggler_report.hpp"

namespace accel::detail {

class deferred_trackers {
 public:
  /// The trackers, made from `opts` (`log_with`, `project`, `mlflow`) at the first call; `Set` is `tracker_set`,
  /// named by a template where it is complete.
  template <class Set, class Options>
  Set& get(const Options& opts) {
    if (!set_) {
      set_ = std::make_shared<Set>(opts.log_with, opts.project, opts.mlflow);
      finish_ = [](tracker_set& made) { static_cast<Set&>(made).finish(); };
      log_verdict_ = [](tracker_set& made, const straggler_verdict& verdict, std::int64_t step) {
        static_cast<Set&>(made).log(
            {{"straggler/slowest_ratio", verdict.slowest_ratio}, {"straggler/slowest_process", verdict.slowest}}, step,
            true);
      };
    }
    return static_cast<Set&>(*set_);
  }

  /// Flushes and closes every tracker (`end_training`); nothing when none was made.
  void finish() {
    if (set_) finish_(*set_);
  }
  /// Logs the straggler report's verdict at `step`, when trackers were made.
  void log_verdict(const straggler_verdict& verdict, std::int64_t step) {
    if (set_) log_verdict_(*set_, verdict, step);
  }

 private:
  std::shared_ptr<tracker_set> set_;
  void (*finish_)(tracker_set&) = nullptr;
  void (*log_verdict_)(tracker_set&, const straggler_verdict&, std::int64_t step) = nullptr;
};

}  // namespace accel::detail
