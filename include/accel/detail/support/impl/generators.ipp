/// \file
/// What generators.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../generators.hpp"

namespace accel::detail {

std::vector<std::pair<std::string, at::Generator>> generators() {
  std::vector<std::pair<std::string, at::Generator>> all{{"cpu_rng", at::detail::getDefaultCPUGenerator()}};
  const int cuda_devices = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  for (int device = 0; device < cuda_devices; ++device)
    all.emplace_back("cuda_rng_" + std::to_string(device), at::globalContext().defaultGenerator(c10::Device(
                                                               c10::kCUDA, static_cast<c10::DeviceIndex>(device))));
  return all;
}

}  // namespace accel::detail
