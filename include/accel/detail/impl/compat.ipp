/// \file
/// What compat.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../compat.hpp"

#include <ATen/autocast_mode.h>

namespace accel::detail::compat {

bool autocast_enabled(c10::DeviceType device) {
#if ACCEL_TORCH_VERSION >= 204
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

void set_autocast_enabled(c10::DeviceType device, bool enabled) {
#if ACCEL_TORCH_VERSION >= 204
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CUDA)
    at::autocast::set_enabled(enabled);
  else
    at::autocast::set_cpu_enabled(enabled);
#endif
}

c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if ACCEL_TORCH_VERSION >= 204
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
#endif
}

void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
#if ACCEL_TORCH_VERSION >= 204
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CUDA)
    at::autocast::set_autocast_gpu_dtype(dtype);
  else
    at::autocast::set_autocast_cpu_dtype(dtype);
#endif
}

}  // namespace accel::detail::compat
