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

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../collectives.hpp"
#include "../options.hpp"
#include "compat.hpp"
#include "text.hpp"

namespace accel::detail {

/// Tensors that can share a flat buffer: same dtype, same device.
using tensor_kind = std::tuple<c10::ScalarType, c10::DeviceType, c10::DeviceIndex>;
inline tensor_kind kind_of(const at::Tensor& t) { return {t.scalar_type(), t.device().type(), t.device().index()}; }

/// Gives every process process 0's values of `tensors`: one flat broadcast per dtype and device.
template <communicator C>
void broadcast_tensors(const std::vector<at::Tensor>& tensors, C& comm) {
  if (comm.size() == 1) return;
  at::NoGradGuard no_grad;
  std::map<tensor_kind, std::vector<at::Tensor>> groups;
  for (const auto& tensor : tensors) groups[kind_of(tensor)].push_back(tensor);
  for (auto& [kind, group] : groups) {
    auto flat = torch::utils::flatten_dense_tensors(group);
    comm.broadcast(flat, 0);
    auto pieces = torch::utils::unflatten_dense_tensors(flat, group);
    for (std::size_t i = 0; i < group.size(); ++i) group[i].copy_(pieces[i]);
  }
}

/// What must be the same on every process for data parallelism: each parameter and buffer, in order, by name,
/// dtype and shape; a line each ("parameter fc.weight: Float [3, 4]").
inline std::vector<std::string> module_layout(const torch::nn::Module& module) {
  std::vector<std::string> lines;
  const auto describe = [&](const char* kind, const std::string& name, const at::Tensor& t) {
    lines.push_back(std::string(kind) + " " + name + ": " + c10::toString(t.scalar_type()) + " " +
                    shape_text(t.sizes()));
  };
  for (const auto& item : module.named_parameters()) describe("parameter", item.key(), item.value());
  for (const auto& item : module.named_buffers()) describe("buffer", item.key(), item.value());
  return lines;
}

/// Checks that every process prepared a model of the same layout, as PyTorch's DDP does at construction: models
/// that differ would otherwise train on scrambled weights (equal sizes) or fail inside Gloo. Every process
/// receives every layout, so all of them throw the same `std::invalid_argument`, naming the first difference.
template <communicator C>
void check_same_module(const torch::nn::Module& module, C& comm) {
  if (comm.size() == 1) return;
  std::string mine;
  for (const auto& line : module_layout(module)) mine += line + "\n";
  const auto all = all_gather_bytes(comm, std::vector<char>(mine.begin(), mine.end()));
  const auto lines_of = [](const std::vector<char>& bytes) {
    std::vector<std::string> lines;
    std::istringstream text(std::string(bytes.begin(), bytes.end()));
    for (std::string line; std::getline(text, line);) lines.push_back(line);
    return lines;
  };
  const auto reference = lines_of(all[0]);
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const auto other = lines_of(all[r]);
    std::size_t i = 0;
    while (i < reference.size() && i < other.size() && reference[i] == other[i]) ++i;
    const auto at = [](const std::vector<std::string>& lines, std::size_t k) {
      return k < lines.size() ? "'" + lines[k] + "'" : std::string("nothing more");
    };
    throw std::invalid_argument("accel::prepare: process " + std::to_string(r) + "'s model differs from process 0's: " +
                                "its parameter or buffer " + std::to_string(i + 1) + " is " + at(other, i) +
                                " where process 0 has " + at(reference, i) +
                                "; data_parallel needs the same model (names, dtypes, shapes) on every process");
  }
}

/// Makes every process start from process 0's parameters and buffers.
template <communicator C>
void broadcast_module_state(torch::nn::Module& module, C& comm) {
  auto tensors = module.parameters();
  for (auto& buffer : module.buffers()) tensors.push_back(buffer);
  broadcast_tensors(tensors, comm);
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
      bucket = open_bucket{.members = {}, .bytes = 0, .first = false};
    }
  }
  for (auto& [key, bucket] : open)
    if (!bucket.members.empty()) buckets.push_back(std::move(bucket.members));
  return buckets;
}

/// The reducer of one prepared model. Registered on construction, unregistered on destruction; neither copied
/// nor moved, because the hooks point at it.
///
/// As in PyTorch's DDP, whether a backward all-reduces is decided by the forward that built its graph
/// (`prepare_for_forward`, called by the prepared model): `no_sync` around the forward is what skips the
/// communication, and `trigger_sync_in_backward` re-arms a graph already built.
template <communicator C>
class gradient_reducer {
 public:
  gradient_reducer(torch::nn::Module& module, C& comm, const bucket_options& limits) : comm_(comm) {
    for (const auto& item : module.named_parameters())
      if (item.value().requires_grad()) {
        names_.push_back(item.key());
        parameters_.push_back(item.value());
      }
    for (const auto& buffer : module.buffers()) buffers_.push_back(buffer);
    if (parameters_.empty()) return;
    build_buckets(assign_buckets(parameters_, limits));
    register_hooks();
  }
  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;
  ~gradient_reducer() {
    abandon_backward();
    for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  }

  /// Whether backward through graphs built from now on all-reduces (false under `no_sync` and on accumulation
  /// micro-steps). With `this_backward`, the graph already built follows too (`trigger_sync_in_backward`).
  void set_sync(bool enabled, bool this_backward = false) noexcept {
    sync_ = enabled;
    if (this_backward) armed_ = enabled;
  }
  [[nodiscard]] bool sync() const noexcept { return sync_; }

  /// Called before each forward of the prepared model. With gradients enabled, arms (or disarms) the hooks for
  /// the backward of this graph and, when synchronising, gives every process process 0's buffers (BatchNorm
  /// statistics), as DDP's `broadcast_buffers`. Also recovers from a backward that threw half-way.
  void prepare_for_forward() {
    if (!at::GradMode::is_enabled()) return;
    abandon_backward();
    armed_ = sync_;
    if (armed_ && !buffers_.empty()) broadcast_tensors(buffers_, comm_);
  }

  /// The parameter indices (registration order) of each bucket, in launch order.
  [[nodiscard]] std::vector<std::vector<std::size_t>> bucket_layout() const {
    std::vector<std::vector<std::size_t>> layout;
    for (const auto& b : buckets_) layout.push_back(b.members);
    return layout;
  }
  /// All-reduces launched since construction: one per bucket per synchronised backward.
  [[nodiscard]] std::uint64_t all_reduce_count() const noexcept { return all_reduce_count_; }
  /// All-reduces launched while backward was still computing gradients, i.e. overlapped with it.
  [[nodiscard]] std::uint64_t overlapped_all_reduce_count() const noexcept { return overlapped_count_; }

 private:
  struct bucket {
    at::Tensor flat;   // the members' gradients, then one "used on this process" flag per member
    at::Tensor scale;  // 1 / world size, 0-d, in the bucket's dtype
    std::vector<std::size_t> members;
    std::int64_t flags_offset = 0;
    std::size_t pending = 0;
    std::optional<typename C::work> in_flight;
  };
  struct location {
    std::size_t bucket;
    std::int64_t offset;
    std::size_t member;
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
      for (std::size_t k = 0; k < members.size(); ++k) {
        const auto i = members[k];
        locations_[i] = {buckets_.size(), numel, k};
        numel += parameters_[i].numel();
      }
      const auto& first = parameters_[members.front()];
      const auto flags = static_cast<std::int64_t>(members.size());
      buckets_.push_back({.flat = at::zeros({numel + flags}, first.options()),
                          .scale = at::scalar_tensor(1.0 / comm_.size(), first.options()),
                          .members = std::move(members),
                          .flags_offset = numel,
                          .pending = 0,
                          .in_flight = std::nullopt});
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
    if (!armed_) return;
    at::NoGradGuard no_grad;  // also under backward(create_graph=true): the bucket copy is not differentiated
    std::lock_guard lock(mutex_);
    if (!in_backward_) begin_backward();
    copy_into_bucket(index);
  }

  void begin_backward() {
    in_backward_ = true;
    graph_done_ = false;
    next_bucket_ = 0;
    ready_.assign(parameters_.size(), false);
    used_.assign(parameters_.size(), false);
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
    used_[index] = grad.defined();
    if (grad.defined() && grad.is_sparse())
      throw std::invalid_argument("accel::data_parallel: parameter " + names_[index] +
                                  " has a sparse gradient, which gradient buckets cannot hold; use a dense layer "
                                  "(for example torch::nn::Embedding without sparse = true)");
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
      std::vector<float> flags;
      for (auto i : b.members) flags.push_back(used_[i] ? 1.0f : 0.0f);
      b.flat.narrow(0, b.flags_offset, static_cast<std::int64_t>(flags.size())).copy_(at::tensor(flags, at::kFloat));
      b.in_flight.emplace(comm_.all_reduce(b.flat, reduction::sum));
      ++all_reduce_count_;
      if (!graph_done_) ++overlapped_count_;
    }
  }

  void finish_backward() {
    std::lock_guard lock(mutex_);
    graph_done_ = true;
    report_unused_parameters();
    for (std::size_t i = 0; i < parameters_.size(); ++i) copy_into_bucket(i);  // unused here: zeros
    for (auto& b : buckets_) {
      auto work = std::move(*b.in_flight);
      b.in_flight.reset();
      work.wait();
    }
    in_backward_ = false;
    const bool all_used_here = std::all_of(used_.begin(), used_.end(), [](bool u) { return u; });
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      auto& grad = parameters_[i].mutable_grad();
      if (used_[i])
        grad.copy_(slot(i));
      else if (all_used_here || used_elsewhere(i))
        grad = slot(i).clone();
      // else: no process produced a gradient; like DDP, leave it undefined so that optimizers skip it
    }
  }

  bool used_elsewhere(std::size_t index) {
    const auto& where = locations_[index];
    const auto& b = buckets_[where.bucket];
    return b.flat[b.flags_offset + static_cast<std::int64_t>(where.member)].template item<float>() > 0;
  }

  /// After a backward that threw (the engine then skips its final callbacks): wait for what was launched,
  /// ignoring its outcome, and start clean.
  void abandon_backward() noexcept {
    std::lock_guard lock(mutex_);
    for (auto& b : buckets_) {
      if (!b.in_flight) continue;
      try {
        b.in_flight->wait();
      } catch (...) {  // the error that interrupted the backward has been reported already
      }
      b.in_flight.reset();
    }
    in_backward_ = false;
  }

  /// A parameter without a gradient would stall its bucket forever in PyTorch's DDP (without
  /// find_unused_parameters); here it counts as zero in the average, and is said once.
  void report_unused_parameters() {
    if (warned_unused_) return;
    std::string unused;
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      if (!ready_[i]) append_item(unused, names_[i]);
    if (unused.empty()) return;
    warned_unused_ = true;
    std::cerr << "accel: process " << comm_.rank() << ": parameters without a gradient in this backward: " << unused
              << "; they count as zero in the average (said once)\n";
  }

  C& comm_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> buffers_;
  std::vector<location> locations_;
  std::vector<bucket> buckets_;
  std::vector<compat::grad_accumulator_handle> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;
  std::vector<bool> ready_;
  std::vector<bool> used_;
  std::mutex mutex_;
  std::size_t next_bucket_ = 0;
  std::uint64_t all_reduce_count_ = 0;
  std::uint64_t overlapped_count_ = 0;
  bool sync_ = true;
  bool armed_ = true;
  bool in_backward_ = false;
  bool graph_done_ = false;
  bool warned_unused_ = false;
};

}  // namespace accel::detail
