/// \file
/// What registry.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../registry.hpp"

namespace accel::detail {

std::vector<torch::optim::Optimizer*> prepared_registry::optimizers() const {
  std::vector<torch::optim::Optimizer*> live;
  for (const auto& weak : optimizers_)
    if (auto entry = weak.lock()) live.push_back(*entry);
  return live;
}

std::vector<std::shared_ptr<even_batches_switch>> prepared_registry::ranges() const {
  std::vector<std::shared_ptr<even_batches_switch>> live;
  for (const auto& weak : ranges_)
    if (auto entry = weak.lock()) live.push_back(std::move(entry));
  return live;
}

std::map<std::string, std::vector<std::shared_ptr<checkpoint_slot>>> prepared_registry::slots_by_kind() const {
  std::map<std::string, std::vector<std::shared_ptr<checkpoint_slot>>> by_kind;
  for (const auto& weak : slots_)
    if (auto slot = weak.lock()) by_kind[slot->kind].push_back(std::move(slot));
  return by_kind;
}

void prepared_registry::release_prepared() {
  models_.clear();
  optimizers_.clear();
  ranges_.clear();
  std::erase_if(slots_, [this](const auto& weak) {
    const auto slot = weak.lock();
    return !slot || std::none_of(kept_.begin(), kept_.end(), [&](const auto& kept) { return kept == slot; });
  });
}

}  // namespace accel::detail
