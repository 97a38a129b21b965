/// \file
/// What reducer.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../reducer.hpp"

namespace accel::detail {

std::vector<std::string> module_layout(const torch::nn::Module& module) {
  std::vector<std::string> lines;
  const auto describe = [&](const char* kind, const std::string& name, const at::Tensor& t) {
    lines.push_back(std::string(kind) + " " + name + ": " + c10::toString(t.scalar_type()) + " " +
                    shape_text(t.sizes()));
  };
  for (const auto& item : module.named_parameters()) describe("parameter", item.key(), item.value());
  for (const auto& item : module.named_buffers()) describe("buffer", item.key(), item.value());
  return lines;
}

std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<at::Tensor>& parameters,
                                                     const bucket_options& limits,
                                                     const std::vector<std::size_t>& groups) {
  const auto to_bytes = [](double mb) { return static_cast<std::size_t>(mb * 1024.0 * 1024.0); };
  struct open_bucket {
    std::vector<std::size_t> members;
    std::size_t bytes = 0;
    bool first = true;
  };
  std::map<tensor_kind, open_bucket> open;
  std::vector<std::vector<std::size_t>> buckets;
  for (std::size_t i = parameters.size(); i-- > 0;) {
    const auto& p = parameters[i];
    auto& bucket = open[kind_of(p)];
    if (!groups.empty() && !bucket.members.empty() && groups[bucket.members.back()] != groups[i]) {
      buckets.push_back(std::move(bucket.members));
      bucket = open_bucket{.members = {}, .bytes = 0, .first = false};
    }
    bucket.members.push_back(i);
    bucket.bytes += p.numel() * p.element_size();
    if (bucket.bytes >= to_bytes(bucket.first ? limits.first_bucket_mb : limits.bucket_cap_mb)) {
      buckets.push_back(std::move(bucket.members));
      bucket = open_bucket{.members = {}, .bytes = 0, .first = false};
    }
  }
  for (auto& [key, bucket] : open)
    if (!bucket.members.empty()) buckets.push_back(std::move(bucket.members));
  return buckets;
}

after_accumulation::~after_accumulation() {
  for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(keys_[i]);
}

}  // namespace accel::detail
