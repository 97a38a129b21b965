/// \file
/// What parallel.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../parallel.hpp"

namespace accel::detail {

double gradient_norm(const std::vector<at::Tensor>& parameters, double norm_type) {
  std::vector<at::Tensor> norms;
  for (const auto& p : parameters)
    if (p.grad().defined()) norms.push_back(p.grad().norm(norm_type));
  if (norms.empty()) return 0.0;
  return std::isinf(norm_type) ? at::stack(norms).max().item<double>()
                               : at::stack(norms).norm(norm_type).item<double>();
}
}  // namespace accel::detail

namespace accel {

single_process::single_process(const options& opts)
    : device_(!opts.cpu && torch::cuda::is_available() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU)) {}
}  // namespace accel

namespace accel::detail {

std::chrono::milliseconds checked_timeout(std::chrono::milliseconds timeout) {
  if (timeout < std::chrono::seconds(1))
    throw std::invalid_argument("accel: options::timeout is " + std::to_string(timeout.count()) +
                                " ms; it bounds the rendezvous and every collective and must be at least 1 s "
                                "(the default is 30 minutes)");
  return timeout;
}

}  // namespace accel::detail
