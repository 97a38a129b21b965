/// \file
/// What owned_shards.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../owned_shards.hpp"

namespace accel::detail {

std::vector<std::size_t> owned_shards::groups() const {
  std::vector<std::size_t> held;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].present) held.push_back(g);
  return held;
}

std::vector<at::Tensor> owned_shards::parameters_of(std::size_t group) const {
  std::vector<at::Tensor> members;
  for (const auto& p : parameters_)
    if (p.group == group) members.push_back(p.full);
  return members;
}

void owned_shards::finish_gather_group(std::size_t group) {
  if (!holds_group(group)) return;
  auto& g = groups_[group];
  if (!g.gathering) return;
  g.gathering = false;
  for (auto& land : std::exchange(g.landing, {})) land();
  if (g.state == parameter_state::at_rest)
    for (auto& p : parameters_)
      if (p.group == group) p.full.set_data(p.gathered);
  g.state = parameter_state::gathered;
}

void owned_shards::free_group(std::size_t group) {
  finish_gather_group(group);
  if (!holds_group(group)) return;
  auto& g = groups_[group];
  if (g.state != parameter_state::gathered) return;
  forget_encoded(group);
  for (auto& p : parameters_)
    if (p.group == group) free_storage(p.gathered);
  g.state = parameter_state::freed;
}

void owned_shards::rest_group(std::size_t group) {
  finish_gather_group(group);
  if (!holds_group(group)) return;
  auto& g = groups_[group];
  if (g.state == parameter_state::at_rest) return;
  forget_encoded(group);
  for (auto& p : parameters_) {
    if (p.group != group) continue;
    p.full.set_data(p.shard);
    if (p.gathered.defined()) free_storage(p.gathered);
  }
  g.state = parameter_state::at_rest;
}

void owned_shards::take_slices_of_full() {
  at::NoGradGuard no_grad;
  for (auto& p : parameters_)
    if (groups_[p.group].state == parameter_state::gathered && p.gathered.defined())
      p.shard.copy_(p.gathered.reshape({-1}).narrow(0, p.span.begin, p.span.length));
}

std::pair<at::Tensor, at::Tensor> owned_shards::own_buffers(const gather_bucket& bucket) const {
  const auto options = parameters_[bucket.members.front()].shard.options();
  return {at::empty({bucket.segment}, options), at::empty({bucket.segment * world_}, options)};
}

void owned_shards::wait_quietly(group_state& group) noexcept {
  for (auto& land : std::exchange(group.landing, {})) try {
      land();
    } catch (...) {
    }
  group.gathering = false;
}

std::function<bool(const at::Tensor&)> owned_shards::encodes(const parameter_encoding* encoding) {
  if (encoding == nullptr) return {};
  return [encoding](const at::Tensor& parameter) { return encoding->encodes(parameter); };
}

void owned_shards::allocate_gathered(std::size_t group) {
  for (auto& p : parameters_) {
    if (p.group != group) continue;
    if (!p.gathered.defined())
      p.gathered = at::empty(p.sizes, p.shard.options());
    else
      reallocate_storage(p.gathered);
  }
}

void owned_shards::forget_encoded(std::size_t group) {
  auto& g = groups_[group];
  if (!g.encoded) return;
  for (std::size_t entry = 0; entry < parameters_.size(); ++entry)
    if (parameters_[entry].group == group && encoded_[entry]) encoding_->released(parameters_[entry].full);
  g.encoded = false;
}

}  // namespace accel::detail
