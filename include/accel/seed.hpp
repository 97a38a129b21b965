/// \file
/// `accel::set_seed(seed)`: Accelerate's `set_seed`, for a C++ program: every random generator the program draws
/// from by default gets `seed`, so that a run repeats; with `device_specific`, `seed + process_index` instead, so
/// that each process draws differently (dropout masks, augmentations) and still repeats.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "detail/support/generators.hpp"
#include "launch.hpp"

namespace accel {

/// Seeds LibTorch's default CPU generator, every CUDA device's, and C's `rand`, with `seed` (plus this process's
/// index, from the launcher's environment, with `device_specific`). A checkpoint saves and restores the same
/// generators, so a resumed run draws on as the interrupted one would have.
inline void set_seed(std::uint64_t seed, bool device_specific = false) {
  if (device_specific) seed += static_cast<std::uint64_t>(read_process_environment().rank);
  for (auto& [name, generator] : detail::generators()) {
    std::lock_guard lock(generator.mutex());  // LibTorch's rule for touching a shared generator
    generator.set_current_seed(seed);
  }
  std::srand(static_cast<unsigned>(seed));
}

}  // namespace accel
