/// \file
/// What optimizer_shards.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../optimizer_shards.hpp"

namespace accel::detail {

std::optional<parameter_shard> optimizer_shards::shard_of(const at::Tensor& parameter) const {
  const auto found = index_.find(parameter.unsafeGetTensorImpl());
  if (found == index_.end()) return std::nullopt;
  const auto& p = parameters_[found->second];
  return parameter_shard{.slice = p.shard, .sizes = p.sizes, .begin = p.span.begin};
}

const shard_span* optimizer_shards::span_of(const at::Tensor& parameter) const {
  const auto found = index_.find(parameter.unsafeGetTensorImpl());
  return found == index_.end() ? nullptr : &parameters_[found->second].span;
}

std::optional<at::Tensor> optimizer_shards::owned_gradient(const at::Tensor& parameter) const {
  const auto found = index_.find(parameter.unsafeGetTensorImpl());
  if (found == index_.end()) return std::nullopt;
  const auto& p = parameters_[found->second];
  if (p.shard.grad().defined()) return p.shard.grad();
  const auto& full = p.full.grad();
  return full.defined() ? full.reshape({-1}).narrow(0, p.span.begin, p.span.length) : at::Tensor();
}

std::int64_t optimizer_shards::gather_buffer_elements() const noexcept {
  std::int64_t elements = 0;
  for (const auto& [kind, segment] : max_segment_) elements += segment * (world_ + 1);
  return elements;
}

std::int64_t optimizer_shards::gather_payload_elements() const noexcept {
  std::int64_t elements = 0;
  for (const auto& bucket : buckets_) elements += bucket.segment * world_;
  return elements;
}

void optimizer_shards::list(torch::optim::Optimizer& optimizer, at::Tensor sharded_parameter::* which) {
  auto& groups = optimizer.param_groups();
  for (const auto& l : listings_) groups[l.group].params()[l.position] = parameters_[l.entry].*which;
}

std::pair<at::Tensor, at::Tensor> optimizer_shards::kept_buffers(const gather_bucket& bucket) {
  auto& buffers = gather_buffers_[bucket.kind];
  if (!buffers.first.defined()) {
    const auto options = parameters_[bucket.members.front()].shard.options();
    buffers = {at::empty({max_segment_[bucket.kind]}, options),
               at::empty({max_segment_[bucket.kind] * world_}, options)};
  }
  return {buffers.first.narrow(0, 0, bucket.segment), buffers.second.narrow(0, 0, bucket.segment * world_)};
}

void optimizer_shards::build_gather_buckets(const bucket_options& limits,
                                            const std::function<bool(const at::Tensor&)>& apart) {
  const bucket_options whole_unit{.first_bucket_mb = 1e12, .bucket_cap_mb = 1e12};
  for (std::size_t group = 0; group < group_count_; ++group) {
    std::vector<std::size_t> entries;
    std::vector<at::Tensor> fulls;
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      if (parameters_[i].group == group) {
        entries.push_back(i);
        fulls.push_back(parameters_[i].full);
      }
    const auto add_bucket = [&](const std::vector<std::size_t>& members, bool direct, bool set_apart) {
      gather_bucket bucket{
          .members = {}, .offsets = {}, .segment = 0, .kind = {}, .group = group, .direct = direct, .apart = set_apart};
      for (auto i : members) {
        bucket.members.push_back(entries[i]);
        bucket.offsets.push_back(bucket.segment);
        bucket.segment += shard_chunk(parameters_[entries[i]].numel, world_);
      }
      bucket.kind = kind_of(parameters_[bucket.members.front()].full);
      if (group == 0 && !direct) max_segment_[bucket.kind] = std::max(max_segment_[bucket.kind], bucket.segment);
      buckets_.push_back(std::move(bucket));
    };
    // Large parameters that split evenly go alone and straight into place; the others in buckets, those set
    // apart among themselves.
    std::vector<std::size_t> bucketed[2];
    std::vector<at::Tensor> bucketed_fulls[2];
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& full = fulls[i];
      const bool set_apart = apart && apart(full);
      if (!set_apart && full.numel() % world_ == 0 &&
          full.numel() * static_cast<std::int64_t>(full.element_size()) >= direct_gather_bytes)
        add_bucket({i}, true, false);
      else {
        bucketed[set_apart].push_back(i);
        bucketed_fulls[set_apart].push_back(full);
      }
    }
    for (const bool set_apart : {false, true})
      for (auto& members : assign_buckets(bucketed_fulls[set_apart], group == 0 ? limits : whole_unit)) {
        for (auto& m : members) m = bucketed[set_apart][m];
        add_bucket(members, false, set_apart);
      }
  }
}

}  // namespace accel::detail
