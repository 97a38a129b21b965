/// \file
/// The straggler report (`options::straggler_window`): each process's own work per optimizer step, its wall time
/// less the time its training thread waited for collectives, compared across the processes at the end of every
/// window of steps. In synchronous training every process's step lasts as long as the slowest one's, so the wall
/// time names no one; the work done outside the waits does. No LibTorch here: the accelerator gathers the figures.
// IWYU pragma: private, include <accel/accelerator.hpp>
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../config.hpp"

namespace accel::detail {

/// Nanoseconds this thread has waited for collectives to complete (each communicator's waits add to it). Per
/// thread: an asynchronous save's waits on its own thread are not the training loop's.
[[nodiscard]] inline std::int64_t& collective_wait_ns() noexcept {
  thread_local std::int64_t waited = 0;
  return waited;
}

/// Adds the time from its making to its end to this thread's collective_wait_ns: made around a wait.
class collective_wait_timer {
 public:
  collective_wait_timer() noexcept : start_(std::chrono::steady_clock::now()) {}
  ~collective_wait_timer() {
    collective_wait_ns() +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  }
  collective_wait_timer(const collective_wait_timer&) = delete;
  collective_wait_timer& operator=(const collective_wait_timer&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
};

/// What one window's figures say.
struct straggler_verdict {
  double slowest_ratio = 1.0;  // the slowest process's work per step over the fastest's
  int slowest = 0;             // its process index
  std::string warning;         // names each process over the threshold; empty when none is
};

/// One process's clock of its own work per optimizer step, window by window.
class straggler_report {
 public:
  /// A process slower than this many times the fastest is a straggler.
  static constexpr double threshold = 1.5;

  /// `window` optimizer steps per figure; 0: off. Refused when negative.
  ACCEL_DECL explicit straggler_report(std::int64_t window);

  /// An optimizer step ended on the training thread. At the end of each window: this process's work per step over
  /// it, in seconds, which every process then gathers (each ends its windows at the same steps).
  [[nodiscard]] ACCEL_DECL std::optional<double> stepped();
  /// The verdict over every process's work per step (in process order) for the window that ended at `step`.
  [[nodiscard]] ACCEL_DECL straggler_verdict judge(const std::vector<double>& seconds_per_step,
                                                   std::int64_t step) const;

 private:
  std::int64_t window_;
  std::int64_t steps_ = -1;  // steps into the window; -1 until the first step starts the first one
  std::chrono::steady_clock::time_point started_;
  std::int64_t waited_at_start_ = 0;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/straggler_report.ipp"
#endif
