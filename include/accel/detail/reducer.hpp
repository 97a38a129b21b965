/// \file
/// Gradient synchronisation as PyTorch's DDP reducer does it: gradients are packed into buckets (reverse
/// registration order, a small first bucket), a hook after each parameter's gradient accumulation copies the
/// gradient into its bucket (pre-divided by the world size), each full bucket is all-reduced asynchronously while
/// backward goes on, strictly in bucket order so every process issues the same sequence, and the averages are
/// written back before `backward()` returns.
// IWYU pragma: private, include <accel/parallel.hpp>
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/utils/tensor_flatten.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../collectives.hpp"
#include "../options.hpp"

namespace accel::detail {

/// Tensors that can share a flat buffer: same dtype, same device.
using tensor_kind = std::tuple<c10::ScalarType, c10::DeviceType, c10::DeviceIndex>;
inline tensor_kind kind_of(const at::Tensor& t) { return {t.scalar_type(), t.device().type(), t.device().index()}; }

/// Makes every process start from process 0's parameters and buffers: one broadcast per dtype.
template <communicator C>
void broadcast_module_state(torch::nn::Module& module, C& comm) {
  if (comm.size() == 1) return;
  at::NoGradGuard no_grad;
  std::map<tensor_kind, std::vector<at::Tensor>> groups;
  for (auto& tensor : module.parameters()) groups[kind_of(tensor)].push_back(tensor);
  for (auto& tensor : module.buffers()) groups[kind_of(tensor)].push_back(tensor);
  for (auto& [key, tensors] : groups) {
    auto flat = torch::utils::flatten_dense_tensors(tensors);
    comm.broadcast(flat, 0);
    auto pieces = torch::utils::unflatten_dense_tensors(flat, tensors);
    for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(pieces[i]);
  }
}

/// Which parameters share a bucket: parameters in reverse registration order (the order backward usually
/// produces their gradients), a bucket per dtype and device closed once it reaches its byte limit (the first
/// limit for a type's first bucket, then the cap).
inline std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<at::Tensor>& parameters,
                                                            const bucket_options& limits) {
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
    bucket.members.push_back(i);
    bucket.bytes += p.numel() * p.element_size();
    if (bucket.bytes >= to_bytes(bucket.first ? limits.first_bucket_mb : limits.bucket_cap_mb)) {
      buckets.push_back(std::move(bucket.members));
      bucket = open_bucket{.first = false};
    }
  }
  for (auto& [key, bucket] : open)
    if (!bucket.members.empty()) buckets.push_back(std::move(bucket.members));
  return buckets;
}

/// The reducer of one prepared model. Registered on construction, unregistered on destruction; neither copied
/// nor moved, because the hooks point at it.
template <communicator C>
class gradient_reducer {
 public:
  gradient_reducer(torch::nn::Module& module, C& comm, const bucket_options& limits) : comm_(comm) {
    for (const auto& item : module.named_parameters())
      if (item.value().requires_grad()) {
        names_.push_back(item.key());
        parameters_.push_back(item.value());
      }
    build_buckets(assign_buckets(parameters_, limits));
    register_hooks();
  }
  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;
  ~gradient_reducer() {
    for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  }

  /// Whether the next backward all-reduces (false under `no_sync` and on accumulation micro-steps).
  void set_sync(bool enabled) noexcept { sync_ = enabled; }
  [[nodiscard]] bool sync() const noexcept { return sync_; }

  /// The parameter indices (registration order) of each bucket, in launch order.
  [[nodiscard]] std::vector<std::vector<std::size_t>> bucket_layout() const {
    std::vector<std::vector<std::size_t>> layout;
    for (const auto& b : buckets_) layout.push_back(b.members);
    return layout;
  }
  /// All-reduces launched since construction: one per bucket per synchronised backward.
  [[nodiscard]] std::uint64_t all_reduce_count() const noexcept { return all_reduce_count_; }

 private:
  struct bucket {
    at::Tensor flat;
    at::Tensor scale;  // 1 / world size, 0-d, in the bucket's dtype
    std::vector<std::size_t> members;
    std::size_t pending = 0;
    std::optional<typename C::work> in_flight;
  };
  struct location {
    std::size_t bucket;
    std::int64_t offset;
  };

  /// Runs after a parameter's gradient has been accumulated into `.grad`.
  class ready_hook final : public torch::autograd::FunctionPostHook {
   public:
    ready_hook(gradient_reducer& reducer, std::size_t index) : reducer_(reducer), index_(index) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list& /*inputs*/) override {
      reducer_.on_gradient_ready(index_);
      return outputs;
    }

   private:
    gradient_reducer& reducer_;
    std::size_t index_;
  };

  void build_buckets(std::vector<std::vector<std::size_t>> layout) {
    locations_.resize(parameters_.size());
    for (auto& members : layout) {
      std::int64_t numel = 0;
      for (auto i : members) {
        locations_[i] = {buckets_.size(), numel};
        numel += parameters_[i].numel();
      }
      const auto& first = parameters_[members.front()];
      buckets_.push_back({.flat = at::zeros({numel}, first.options()),
                          .scale = at::scalar_tensor(1.0 / comm_.size(), first.options()),
                          .members = std::move(members)});
    }
  }

  void register_hooks() {
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      // The variable only holds a weak reference to its accumulator: keep it alive for as long as the hook.
      accumulators_.push_back(torch::autograd::impl::grad_accumulator(parameters_[i]));
      hook_keys_.push_back(accumulators_.back()->add_post_hook(std::make_unique<ready_hook>(*this, i)));
    }
  }

  void on_gradient_ready(std::size_t index) {
    if (!sync_) return;
    std::lock_guard lock(mutex_);
    if (!in_backward_) begin_backward();
    copy_into_bucket(index);
  }

  void begin_backward() {
    in_backward_ = true;
    next_bucket_ = 0;
    ready_.assign(parameters_.size(), false);
    for (auto& b : buckets_) b.pending = b.members.size();
    // Runs once this backward's graph is done, before backward() returns.
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  }

  at::Tensor slot(std::size_t index) {
    const auto& where = locations_[index];
    const auto& p = parameters_[index];
    return buckets_[where.bucket].flat.narrow(0, where.offset, p.numel()).view(p.sizes());
  }

  void copy_into_bucket(std::size_t index) {
    if (ready_[index]) return;
    ready_[index] = true;
    const auto& grad = parameters_[index].grad();
    auto destination = slot(index);
    auto& b = buckets_[locations_[index].bucket];
    if (grad.defined())
      at::mul_out(destination, grad, b.scale);  // divides by the world size while copying, saving a pass
    else
      destination.zero_();
    if (--b.pending == 0) launch_ready_buckets();
  }

  /// Launches, in bucket order, every bucket that is complete: the same sequence on every process.
  void launch_ready_buckets() {
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
      auto& b = buckets_[next_bucket_++];
      b.in_flight.emplace(comm_.all_reduce(b.flat, reduction::sum));
      ++all_reduce_count_;
    }
  }

  void finish_backward() {
    std::lock_guard lock(mutex_);
    in_backward_ = false;
    report_unused_parameters();
    for (std::size_t i = 0; i < parameters_.size(); ++i) copy_into_bucket(i);  // unused ones count as zeros
    for (auto& b : buckets_) {
      b.in_flight->wait();
      b.in_flight.reset();
    }
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      auto& grad = parameters_[i].mutable_grad();
      if (grad.defined())
        grad.copy_(slot(i));
      else
        grad = slot(i).clone();
    }
  }

  /// Parameters without a gradient would stall their bucket forever in PyTorch's DDP (without
  /// find_unused_parameters); here they are all-reduced as zeros, and said once.
  void report_unused_parameters() {
    if (warned_unused_) return;
    std::string unused;
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      if (!ready_[i]) unused += (unused.empty() ? "" : ", ") + names_[i];
    if (unused.empty()) return;
    warned_unused_ = true;
    std::cerr << "accel: process " << comm_.rank() << ": parameters without a gradient in this backward: " << unused
              << "; they are all-reduced as zero gradients (said once)\n";
  }

  C& comm_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> parameters_;
  std::vector<location> locations_;
  std::vector<bucket> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;
  std::vector<bool> ready_;
  std::mutex mutex_;
  std::size_t next_bucket_ = 0;
  std::uint64_t all_reduce_count_ = 0;
  bool sync_ = true;
  bool in_backward_ = false;
  bool warned_unused_ = false;
};

}  // namespace accel::detail
