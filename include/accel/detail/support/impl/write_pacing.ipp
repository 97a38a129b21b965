/// \file
/// What write_pacing.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../write_pacing.hpp"

#include <chrono>
#include <thread>

namespace accel::detail {

namespace pacing_internals {

struct thread_pace {
  double duty_cycle = 1.0;
  std::chrono::steady_clock::time_point resumed{};  // when this thread last went back to work
};

inline thread_pace& this_thread() {
  thread_local thread_pace pace;
  return pace;
}

}  // namespace pacing_internals

write_pacing::write_pacing(double duty_cycle) : previous_(pacing_internals::this_thread().duty_cycle) {
  auto& pace = pacing_internals::this_thread();
  pace.duty_cycle = duty_cycle;
  pace.resumed = std::chrono::steady_clock::now();
}

write_pacing::~write_pacing() { pacing_internals::this_thread().duty_cycle = previous_; }

bool write_pacing::active() noexcept { return pacing_internals::this_thread().duty_cycle < 1.0; }

void write_pacing::pause() {
  auto& pace = pacing_internals::this_thread();
  if (pace.duty_cycle >= 1.0) return;
  const auto worked = std::chrono::steady_clock::now() - pace.resumed;  // serialising and checksumming included
  std::this_thread::sleep_for(std::chrono::duration<double>(worked) * (1.0 / pace.duty_cycle - 1.0));
  pace.resumed = std::chrono::steady_clock::now();
}

}  // namespace accel::detail
