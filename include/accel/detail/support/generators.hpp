/// \file
/// The default random generators of this process, by name: what a checkpoint saves and restores, and what
/// `accel::set_seed` seeds.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/cuda.h>

#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"

namespace accel::detail {

/// The generators a checkpoint holds, by key: the CPU's, then each CUDA device's.
ACCEL_DECL std::vector<std::pair<std::string, at::Generator>> generators();

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/generators.ipp"
#endif
