/// \file
/// `accel::set_seed(seed)`: Accelerate's `set_seed`, for a C++ program: every random generator the program draws
/// from by default gets `seed`, so that a run repeats; with `device_specific`, `seed + process_index` instead, so
/// that each process draws differently (dropout masks, augmentations) and still repeats.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "detail/config.hpp"
#include "detail/support/generators.hpp"
#include "launch.hpp"

namespace accel {

/// Seeds LibTorch's default CPU generator, every CUDA device's, and C's `rand`, with `seed` (plus this process's
/// index, from the launcher's environment, with `device_specific`). A checkpoint saves and restores the same
/// generators, so a resumed run draws on as the interrupted one would have.
ACCEL_DECL void set_seed(std::uint64_t seed, bool device_specific = false);

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/seed.ipp"
#endif
