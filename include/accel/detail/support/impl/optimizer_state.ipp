/// \file
/// What optimizer_state.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../optimizer_state.hpp"

namespace accel::detail {

std::unique_ptr<torch::optim::OptimizerParamState> empty_state_of(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return std::make_unique<torch::optim::AdamWParamState>();
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return std::make_unique<torch::optim::AdamParamState>();
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return std::make_unique<torch::optim::SGDParamState>();
  if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer))
    return std::make_unique<torch::optim::RMSpropParamState>();
  if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer))
    return std::make_unique<torch::optim::AdagradParamState>();
  return nullptr;
}

}  // namespace accel::detail
