/// \file
/// What seed.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../seed.hpp"

namespace accel {

void set_seed(std::uint64_t seed, bool device_specific) {
  if (device_specific) seed += static_cast<std::uint64_t>(read_process_environment().rank);
  for (auto& [name, generator] : detail::generators()) {
    std::lock_guard lock(generator.mutex());  // LibTorch's rule for touching a shared generator
    generator.set_current_seed(seed);
  }
  std::srand(static_cast<unsigned>(seed));
}

}  // namespace accel
