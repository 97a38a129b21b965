/// \file
/// What unit_hooks.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../unit_hooks.hpp"

namespace accel::detail {

void shard_unit_base::attach(std::weak_ptr<unit_hooks> hooks, std::size_t index) noexcept {
  hooks_ = std::move(hooks);
  index_ = index;
}

void shard_unit_base::slice_if_constructing(torch::nn::Module& module) {
  if (auto* construction = construction_in_progress()) constructed_ = construction->slice_unit(module);
}

}  // namespace accel::detail
