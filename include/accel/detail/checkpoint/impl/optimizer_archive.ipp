/// \file
/// What optimizer_archive.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../optimizer_archive.hpp"

#include <vector>

#include "../../compat.hpp"
#include "../../support/archive.hpp"
#include "../../support/optimizer_state.hpp"

namespace accel::detail {

void save_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::OutputArchive& archive) {
  optimizer.save(archive);
  std::vector<double> lrs;
  for (auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  archive.write("accel_learning_rates", c10::IValue(lrs));
}

void load_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive) {
  optimizer.load(archive);
  c10::IValue lrs;
  if (!archive.try_read("accel_learning_rates", lrs)) return;
  const auto values = lrs.toDoubleVector();
  auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size() && g < values.size(); ++g) groups[g].options().set_lr(values[g]);
}

void place_state_on_parameters(torch::optim::Optimizer& optimizer, const c10::Device& read_to) {
  auto& states = optimizer.state();
  for (auto& group : optimizer.param_groups())
    for (auto& parameter : group.params()) {
      const auto found = states.find(compat::optimizer_state_key(parameter));
      if (found == states.end()) continue;
      const auto device = parameter.device();
      const bool elementwise = transform_state_tensors(*found->second, [&device](const at::Tensor& tensor) {
        return tensor.device() == device ? tensor : tensor.to(device);
      });
      if (elementwise || device == read_to) continue;
      torch::serialize::OutputArchive out;
      found->second->serialize(out);
      const auto bytes = serialised(out);
      torch::serialize::InputArchive in;
      in.load_from(bytes.data(), bytes.size(), device);
      found->second->serialize(in);
    }
}

}  // namespace accel::detail
