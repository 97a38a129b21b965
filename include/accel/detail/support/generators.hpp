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

namespace accel::detail {

/// The generators a checkpoint holds, by key: the CPU's, then each CUDA device's.
inline std::vector<std::pair<std::string, at::Generator>> generators() {
  std::vector<std::pair<std::string, at::Generator>> all{{"cpu_rng", at::detail::getDefaultCPUGenerator()}};
  const int cuda_devices = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  for (int device = 0; device < cuda_devices; ++device)
    all.emplace_back("cuda_rng_" + std::to_string(device), at::globalContext().defaultGenerator(c10::Device(
                                                               c10::kCUDA, static_cast<c10::DeviceIndex>(device))));
  return all;
}

}  // namespace accel::detail
