/// \file
/// What straggler_report.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../straggler_report.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace accel::detail {

straggler_report::straggler_report(std::int64_t window) : window_(window) {
  if (window < 0)
    throw std::invalid_argument("accel::options: straggler_window = " + std::to_string(window) +
                                " is negative; give the optimizer steps per report, or 0 to turn it off");
}

std::optional<double> straggler_report::stepped() {
  if (window_ <= 0 || (steps_ >= 0 && ++steps_ < window_)) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();  // read at a window's ends only
  std::optional<double> figure;
  if (steps_ >= 0) {
    const double wall = std::chrono::duration<double>(now - started_).count();
    const double waited = static_cast<double>(collective_wait_ns() - waited_at_start_) * 1e-9;
    figure = std::max(wall - waited, 0.0) / static_cast<double>(window_);
  }
  steps_ = 0;
  started_ = now;
  waited_at_start_ = collective_wait_ns();
  return figure;
}

straggler_verdict straggler_report::judge(const std::vector<double>& seconds_per_step, std::int64_t step) const {
  straggler_verdict verdict;
  if (seconds_per_step.size() < 2) return verdict;
  const auto fastest = std::min_element(seconds_per_step.begin(), seconds_per_step.end());
  const auto slowest = std::max_element(seconds_per_step.begin(), seconds_per_step.end());
  if (*fastest <= 0) return verdict;
  verdict.slowest_ratio = *slowest / *fastest;
  verdict.slowest = static_cast<int>(slowest - seconds_per_step.begin());
  const auto milliseconds = [](double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f ms", seconds * 1e3);
    return std::string(text);
  };
  for (std::size_t p = 0; p < seconds_per_step.size(); ++p) {
    const double ratio = seconds_per_step[p] / *fastest;
    if (ratio <= threshold) continue;
    char times[16];
    std::snprintf(times, sizeof times, "%.2fx", ratio);
    verdict.warning += "accel: straggler: process " + std::to_string(p) + " worked " + times +
                       " as long per optimizer step as the fastest, process " +
                       std::to_string(fastest - seconds_per_step.begin()) + " (" + milliseconds(seconds_per_step[p]) +
                       " against " + milliseconds(*fastest) + " of its own work, waits for collectives left out, " +
                       "over steps " + std::to_string(step - window_ + 1) + " to " + std::to_string(step) +
                       "); every process waits for it at each synchronisation\n";
  }
  return verdict;
}

}  // namespace accel::detail
