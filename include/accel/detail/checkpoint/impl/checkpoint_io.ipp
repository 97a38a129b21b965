/// \file
/// What checkpoint_io.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../checkpoint_io.hpp"

namespace accel::detail {

c10::Device read_device(std::optional<map_location> where, int processes, const c10::Device& device) {
  const auto chosen = where.value_or(processes > 1 && !device.is_cpu() ? map_location::on_device : map_location::cpu);
  return chosen == map_location::on_device ? device : c10::Device(c10::kCPU);
}

}  // namespace accel::detail
