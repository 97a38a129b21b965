/// \file
/// Every difference between the LibTorch versions accel supports (Debian's 1.13 and PyTorch 2.x) lives here.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/version.h>

/// LibTorch's version as MAJOR * 100 + MINOR (113 for 1.13, 204 for 2.4).
#define ACCEL_TORCH_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)

namespace accel::detail::compat {

/// `Optimizer::zero_grad(set_to_none)`: 2.x has the flag; 1.13 only zeroes in place.
inline void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
#if ACCEL_TORCH_VERSION >= 200
  optimizer.zero_grad(set_to_none);
#else
  if (!set_to_none) {
    optimizer.zero_grad();
    return;
  }
  for (auto& group : optimizer.param_groups())
    for (auto& parameter : group.params()) parameter.mutable_grad().reset();
#endif
}

}  // namespace accel::detail::compat
