/// \file
/// `write_pacing`: how much of its time a thread spends writing files. An asynchronous save's thread writes at a
/// share of its time (`save_options::write_duty_cycle`), so that the training beside it, which shares the CPUs'
/// caches and memory with it, slows little; every other thread writes flat out.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <cstddef>

#include "../config.hpp"

namespace accel::detail {

/// Sets this thread's duty cycle while it lives: below 1, each file write is cut into pieces (`piece_bytes`), and
/// after each the thread sleeps long enough that the work since the last pause took `duty_cycle` of the time.
class write_pacing {
 public:
  static constexpr std::size_t piece_bytes = std::size_t{4} << 20;

  ACCEL_DECL explicit write_pacing(double duty_cycle);
  ACCEL_DECL ~write_pacing();
  write_pacing(const write_pacing&) = delete;
  write_pacing& operator=(const write_pacing&) = delete;

  /// Whether this thread's writes are paced.
  [[nodiscard]] ACCEL_DECL static bool active() noexcept;
  /// Between two pieces: sleeps for this thread's share.
  ACCEL_DECL static void pause();

 private:
  double previous_;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/write_pacing.ipp"
#endif
