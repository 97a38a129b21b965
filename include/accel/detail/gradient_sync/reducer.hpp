/// \file
/// Gradient synchronisation as PyTorch's DDP reducer does it: gradients are packed into buckets (reverse
/// registration order, a small first bucket), a hook after each parameter's gradient accumulation copies the
/// gradient into its bucket (pre-divided by the world size), each full bucket is all-reduced asynchronously while
/// backward goes on, strictly in bucket order so every process issues the same sequence, and the averages are
/// written back before `backward()` returns.
///
/// With the sharded layout (zero2), a bucket holds P segments, the r-th made of process r's slices of its members'
/// gradients (shard_layout.hpp); each full bucket is reduce-scattered instead, each process keeps the averaged
/// segment for its own slices as its shard gradients, and the full gradients are released as soon as they are in a
/// bucket. Buckets are allocated when their first gradient arrives and freed once reduced, at most two in flight
/// (so backward holds at most three, one filling, and the two collectives' receive buffers). Hybrid sharding gives
/// the reducer its shard group and the replicas: each reduced segment is all-reduced across them before it is kept.
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
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../collectives.hpp"
#include "../../options.hpp"
#include "comm_hooks.hpp"
#include "../compat.hpp"
#include "../sharding/shard_layout.hpp"
#include "../support/text.hpp"

namespace accel::detail {

/// Tensors that can share a flat buffer: same dtype, same device.
using tensor_kind = std::tuple<c10::ScalarType, c10::DeviceType, c10::DeviceIndex>;
inline tensor_kind kind_of(const at::Tensor& t) { return {t.scalar_type(), t.device().type(), t.device().index()}; }

/// Runs `collective` on `tensors` flattened, one flat tensor per dtype and device, in a fixed order (the same on
/// every process); it changes the flat tensor in place or replaces it, and the result is copied back into the tensors.
template <class Collective>
void through_flat_groups(const std::vector<at::Tensor>& tensors, Collective&& collective) {
  at::NoGradGuard no_grad;
  std::map<tensor_kind, std::vector<at::Tensor>> groups;
  for (const auto& tensor : tensors) groups[kind_of(tensor)].push_back(tensor);
  for (auto& [kind, group] : groups) {
    auto flat = torch::utils::flatten_dense_tensors(group);
    collective(flat);
    auto pieces = torch::utils::unflatten_dense_tensors(flat, group);
    for (std::size_t i = 0; i < group.size(); ++i) group[i].copy_(pieces[i]);
  }
}

/// Gives every process process `source`'s values of `tensors`: one flat broadcast per dtype and device.
template <communicator C>
void broadcast_tensors(const std::vector<at::Tensor>& tensors, C& comm, int source = 0) {
  if (comm.size() == 1) return;
  through_flat_groups(tensors, [&](at::Tensor& flat) { comm.broadcast(flat, source); });
}

/// What must be the same on every process for data parallelism: each parameter and buffer, in order, by name,
/// dtype and shape; a line each ("parameter fc.weight: Float [3, 4]").
ACCEL_DECL std::vector<std::string> module_layout(const torch::nn::Module& module);

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

/// Makes every process's parameters and buffers those of process `source` (0: where training starts), but the
/// parameters `kept_apart` names (built sliced by accel::construct_sharded: each process holds its own slice only).
template <communicator C>
void broadcast_module_state(const torch::nn::Module& module, C& comm, int source = 0,
                            const std::function<bool(const at::Tensor&)>& kept_apart = {}) {
  auto tensors = module.parameters();
  if (kept_apart) std::erase_if(tensors, kept_apart);
  for (auto& buffer : module.buffers()) tensors.push_back(buffer);
  broadcast_tensors(tensors, comm, source);
}

/// Which parameters share a bucket: parameters in reverse registration order (the order backward usually
/// produces their gradients), a bucket per dtype and device closed once it reaches its byte limit (the first
/// limit for a type's first bucket, then the cap). With `groups` (one per parameter), a bucket holds parameters of
/// one group only: fully_sharded's units reduce-scatter and gather their own buckets.
ACCEL_DECL std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<at::Tensor>& parameters,
                                                                const bucket_options& limits,
                                                                const std::vector<std::size_t>& groups = {});

/// Calls to make after leaves' gradients were accumulated into `.grad` (post hooks of their accumulator nodes),
/// removed on destruction. Neither copied nor moved: the calls usually point at the owner.
class after_accumulation {
 public:
  after_accumulation() = default;
  after_accumulation(const after_accumulation&) = delete;
  after_accumulation& operator=(const after_accumulation&) = delete;
  ACCEL_DECL ~after_accumulation();

  /// Calls `on_accumulated()` each time `leaf`'s gradient has been accumulated.
  template <class OnAccumulated>
  void add(const at::Tensor& leaf, OnAccumulated on_accumulated) {
    // The leaf only holds a weak reference to its accumulator: keep it alive for as long as the hook.
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(leaf));
    keys_.push_back(
        accumulators_.back()->add_post_hook(std::make_unique<hook<OnAccumulated>>(std::move(on_accumulated))));
  }

 private:
  template <class OnAccumulated>
  class hook final : public torch::autograd::FunctionPostHook {
   public:
    explicit hook(OnAccumulated on_accumulated) : on_accumulated_(std::move(on_accumulated)) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list& /*inputs*/) override {
      on_accumulated_();
      return outputs;
    }

   private:
    OnAccumulated on_accumulated_;
  };

  std::vector<compat::grad_accumulator_handle> accumulators_;
  std::vector<std::uintptr_t> keys_;
};

/// The reducer of one prepared model. Registered on construction, unregistered on destruction; neither copied
/// nor moved, because the hooks point at it.
///
/// As in PyTorch's DDP, whether a backward all-reduces is decided by the forward that built its graph
/// (`prepare_for_forward`, called by the prepared model): `no_sync` around the forward is what skips the
/// communication, and `trigger_sync_in_backward` re-arms a graph already built.
template <communicator C, gradient_layout Layout = gradient_layout::replicated>
class gradient_reducer {
  static constexpr bool sharded = Layout == gradient_layout::sharded;

 public:
  /// `group_of` (a parameter's group, or none) keeps each bucket within a group (assign_buckets); `hook`, when
  /// given, reduces each bucket instead of a plain all-reduce (the replicated layout's all-reduce only). `replicas`
  /// (sharded layout, hybrid sharding): the processes holding the same slices as this one in the other shard groups;
  /// each reduce-scattered segment is then all-reduced across them, and every gradient is divided by the whole
  /// job's size, `comm`'s times theirs.
  gradient_reducer(torch::nn::Module& module, C& comm, const bucket_options& limits,
                   const std::function<std::size_t(const at::Tensor&)>& group_of = {},
                   std::unique_ptr<bucket_hook<C>> hook = nullptr, C* replicas = nullptr)
      : comm_(comm), replicas_(replicas), hook_(std::move(hook)) {
    std::vector<std::size_t> groups;
    for (const auto& item : module.named_parameters())
      if (item.value().requires_grad()) {
        if constexpr (sharded) index_.emplace(item.value().unsafeGetTensorImpl(), parameters_.size());
        names_.push_back(item.key());
        parameters_.push_back(item.value());
        if (group_of) groups.push_back(group_of(item.value()));
      }
    if constexpr (sharded) shard_gradients_.resize(parameters_.size());
    for (const auto& buffer : module.buffers()) buffers_.push_back(buffer);
    if (parameters_.empty()) return;
    build_buckets(assign_buckets(parameters_, limits, groups));
    register_hooks();
  }
  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;
  ~gradient_reducer() { abandon_backward(); }

  /// Whether backward through graphs built from now on all-reduces (false under `no_sync` and on accumulation
  /// micro-steps). With `this_backward`, the graph already built follows too (`trigger_sync_in_backward`).
  void set_sync(bool enabled, bool this_backward = false) noexcept {
    sync_ = enabled;
    if (this_backward) armed_ = enabled;
  }
  [[nodiscard]] bool sync() const noexcept { return sync_; }

  /// Called before each forward of the prepared model. With gradients enabled, arms (or disarms) the hooks for
  /// the backward of this graph and, when synchronising, gives every process the buffers (BatchNorm statistics) of
  /// process `buffer_source` (0, or the last still training under join_uneven_inputs), as DDP's
  /// `broadcast_buffers`. Also recovers from a backward that threw half-way.
  void prepare_for_forward(int buffer_source = 0) {
    if (!at::GradMode::is_enabled()) return;
    abandon_backward();
    armed_ = sync_;
    if (armed_ && !buffers_.empty()) broadcast_tensors(buffers_, comm_, buffer_source);
  }

  /// On a process that has run out of data (join_uneven_inputs): the collectives of another process's synchronised
  /// forward and backward, with nothing of this one's: the buffer broadcast from `buffer_source` (as DDP's join
  /// hook, into this process's buffers too), then every bucket's reduction (through the communication hook, if
  /// any), of zeros, in bucket order. Its gradients are left alone. Replicated layout only: a sharded policy has more
  /// collectives around its step.
  void shadow_synchronised_step(int buffer_source)
    requires(!sharded)
  {
    abandon_backward();
    if (!buffers_.empty()) broadcast_tensors(buffers_, comm_, buffer_source);
    at::NoGradGuard no_grad;
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      buckets_[k].flat.zero_();
      buckets_[k].in_flight.emplace(launch_all_reduce(k));
      ++launched_count_;
      payload_elements_ += static_cast<std::uint64_t>(buckets_[k].flat.numel());
    }
    for (auto& b : buckets_) std::exchange(b.in_flight, std::nullopt)->wait();
  }

  /// The parameter indices (registration order) of each bucket, in launch order.
  [[nodiscard]] std::vector<std::vector<std::size_t>> bucket_layout() const {
    std::vector<std::vector<std::size_t>> layout;
    for (const auto& b : buckets_) layout.push_back(b.members);
    return layout;
  }
  /// All-reduces launched since construction: one per bucket per synchronised backward.
  [[nodiscard]] std::uint64_t all_reduce_count() const noexcept
    requires(!sharded)
  {
    return launched_count_;
  }
  /// Reduce-scatters launched since construction: one per bucket per synchronised backward.
  [[nodiscard]] std::uint64_t reduce_scatter_count() const noexcept
    requires sharded
  {
    return launched_count_;
  }
  /// Collectives launched while backward was still computing gradients, i.e. overlapped with it.
  [[nodiscard]] std::uint64_t overlapped_count() const noexcept { return overlapped_count_; }
  /// Elements the gradient collectives were given since construction (each bucket's flat tensor, padding and
  /// "used" flags included): what is all-reduced, or what is reduce-scattered.
  [[nodiscard]] std::uint64_t payload_elements() const noexcept { return payload_elements_; }
  /// Hybrid sharding: elements all-reduced across the replicas since construction (each reduced segment, padding and
  /// flags included).
  [[nodiscard]] std::uint64_t replica_elements() const noexcept { return replica_elements_; }
  /// Bytes handed to the gradient all-reduces since construction: the buckets as they are, or what the
  /// communication hook sent instead (cast, low-rank).
  [[nodiscard]] std::uint64_t communicated_bytes() const noexcept
    requires(!sharded)
  {
    return hook_ ? hook_->communicated_bytes() : plain_bytes_;
  }

  /// This process's averaged slice of `parameter`'s gradient (its span, shard_layout.hpp), kept after backward in
  /// place of the full gradient; null for a parameter this reducer does not hold. Undefined until a synchronised
  /// backward gives it one; later ones add to it until it is cleared.
  [[nodiscard]] at::Tensor* shard_gradient(const at::Tensor& parameter)
    requires sharded
  {
    const auto found = index_.find(parameter.unsafeGetTensorImpl());
    return found == index_.end() ? nullptr : &shard_gradients_[found->second];
  }

 private:
  struct bucket {
    at::Tensor flat;   // the members' gradients, then one "used on this process" flag per member (sharded: P
                       // such segments of each member's chunk; allocated while in use)
    at::Tensor scale;  // 1 / world size, 0-d, in the bucket's dtype
    std::vector<std::size_t> members;
    std::int64_t flags_offset = 0;
    std::int64_t segment = 0;  // sharded: elements of one process's segment, flags included
    std::size_t pending = 0;
    std::optional<bucket_work> in_flight;
    at::Tensor reduced;  // sharded: this process's averaged segment, once reduce-scattered
  };
  struct location {
    std::size_t bucket;
    std::int64_t offset;
    std::size_t member;
  };

  int replica_count() const noexcept { return replicas_ == nullptr ? 1 : replicas_->size(); }

  /// Elements parameter `index` takes in its bucket: all of them, or (sharded) its chunk in each segment.
  std::int64_t stored_elements(std::size_t index) const {
    const auto numel = parameters_[index].numel();
    return sharded ? shard_chunk(numel, comm_.size()) : numel;
  }

  void build_buckets(std::vector<std::vector<std::size_t>> layout) {
    locations_.resize(parameters_.size());
    for (auto& members : layout) {
      std::int64_t numel = 0;
      for (std::size_t k = 0; k < members.size(); ++k) {
        const auto i = members[k];
        locations_[i] = {buckets_.size(), numel, k};
        numel += stored_elements(i);
      }
      const auto& first = parameters_[members.front()];
      const auto flags = static_cast<std::int64_t>(members.size());
      buckets_.push_back({.flat = sharded ? at::Tensor() : at::zeros({numel + flags}, first.options()),
                          .scale = at::scalar_tensor(1.0 / (comm_.size() * replica_count()), first.options()),
                          .members = std::move(members),
                          .flags_offset = numel,
                          .segment = numel + flags,
                          .pending = 0,
                          .in_flight = std::nullopt,
                          .reduced = {}});
    }
  }

  void register_hooks() {
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      hooks_.add(parameters_[i], [this, i] { on_gradient_ready(i); });
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
    auto& b = buckets_[locations_[index].bucket];
    used_[index] = grad.defined();
    if (grad.defined() && grad.is_sparse())
      throw std::invalid_argument("accel::data_parallel: parameter " + names_[index] +
                                  " has a sparse gradient, which gradient buckets cannot hold; use a dense layer "
                                  "(for example torch::nn::Embedding without sparse = true)");
    if constexpr (sharded) {
      copy_slices_into_bucket(index, b);
      parameters_[index].mutable_grad() = at::Tensor();  // in the bucket now: only this process's slice is kept
    } else {
      auto destination = slot(index);
      if (grad.defined())
        at::mul_out(destination, grad, b.scale);  // divides by the world size while copying, saving a pass
      else
        destination.zero_();
    }
    if (--b.pending == 0) launch_ready_buckets();
  }

  /// Sharded: each process's slice of the gradient (divided by the world size) into that process's segment, padded
  /// with zeros to the chunk; zeros for a parameter without a gradient here.
  void copy_slices_into_bucket(std::size_t index, bucket& b) {
    const auto& p = parameters_[index];
    if (!b.flat.defined()) b.flat = at::empty({b.segment * comm_.size()}, p.options());
    const auto chunk = stored_elements(index);
    const auto& grad = p.grad();
    const auto flat_grad = grad.defined() ? grad.reshape({-1}) : at::Tensor();
    for (int r = 0; r < comm_.size(); ++r) {
      auto destination = b.flat.narrow(0, r * b.segment + locations_[index].offset, chunk);
      const auto span = shard_span_of(p.numel(), r, comm_.size());
      if (!grad.defined()) {
        destination.zero_();
        continue;
      }
      auto owned = destination.narrow(0, 0, span.length);
      at::mul_out(owned, flat_grad.narrow(0, span.begin, span.length), b.scale);
      destination.narrow(0, span.length, chunk - span.length).zero_();
    }
  }

  /// Launches, in bucket order, every bucket that is complete: the same sequence on every process.
  void launch_ready_buckets() {
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
      // Sharded: bound the buckets held at once (memory is the point): two in flight, the one before last finished.
      if constexpr (sharded)
        if (next_bucket_ >= 2) finish_sharded_bucket(buckets_[next_bucket_ - 2]);
      auto& b = buckets_[next_bucket_++];
      std::vector<float> flags;
      for (auto i : b.members) flags.push_back(used_[i] ? 1.0f : 0.0f);
      const auto flag_values = at::tensor(flags, at::kFloat);
      const auto segments = sharded ? comm_.size() : 1;  // sharded: every segment counts the users of its slices
      for (int r = 0; r < segments; ++r)
        b.flat.narrow(0, r * b.segment + b.flags_offset, flag_values.numel()).copy_(flag_values);
      if constexpr (sharded) {
        b.reduced = at::empty({b.segment}, b.flat.options());
        b.in_flight.emplace(comm_.reduce_scatter_into(b.reduced, b.flat));
      } else {
        b.in_flight.emplace(launch_all_reduce(next_bucket_ - 1));
      }
      ++launched_count_;
      payload_elements_ += static_cast<std::uint64_t>(b.flat.numel());
      if (!graph_done_) ++overlapped_count_;
    }
  }

  /// Starts summing bucket `index` over the processes: through the communication hook, or as it is.
  bucket_work launch_all_reduce(std::size_t index) {
    auto& b = buckets_[index];
    if (!hook_) {
      plain_bytes_ += static_cast<std::uint64_t>(b.flat.nbytes());
      return bucket_work(comm_.all_reduce(b.flat, reduction::sum));
    }
    bucket_contents contents{.index = index,
                             .count = buckets_.size(),
                             .flat = b.flat,
                             .gradients = b.flat.narrow(0, 0, b.flags_offset),
                             .flags = b.flat.narrow(0, b.flags_offset, b.flat.numel() - b.flags_offset),
                             .members = {}};
    for (auto i : b.members) contents.members.push_back(slot(i));
    return hook_->launch(comm_, contents);
  }

  /// Sharded: waits for a reduce-scattered bucket, adds this process's averaged slices to its shard gradients
  /// (left undefined where no process had a gradient, as DDP leaves them), and frees the bucket.
  void finish_sharded_bucket(bucket& b) {
    if (!b.in_flight) return;
    auto work = std::move(*b.in_flight);
    b.in_flight.reset();
    work.wait();
    if (replicas_ != nullptr) {  // the same slices' sums from the other shard groups: the whole job's average
      replicas_->all_reduce(b.reduced, reduction::sum).wait();
      replica_elements_ += static_cast<std::uint64_t>(b.reduced.numel());
    }
    const auto users = b.reduced.narrow(0, b.flags_offset, static_cast<std::int64_t>(b.members.size())).to(at::kCPU);
    for (std::size_t k = 0; k < b.members.size(); ++k) {
      if (users[static_cast<std::int64_t>(k)].template item<float>() == 0) continue;
      const auto i = b.members[k];
      const auto mine = b.reduced.narrow(0, locations_[i].offset,
                                         shard_span_of(parameters_[i].numel(), comm_.rank(), comm_.size()).length);
      auto& kept = shard_gradients_[i];
      if (kept.defined())
        kept.add_(mine);  // accumulation with sync_each_batch, or zero_grad(set_to_none = false)
      else
        kept = mine;
    }
    b.flat = at::Tensor();
    b.reduced = at::Tensor();  // the shard gradients keep their views of it alive
  }

  void finish_backward() {
    std::lock_guard lock(mutex_);
    graph_done_ = true;
    report_unused_parameters();
    for (std::size_t i = 0; i < parameters_.size(); ++i) copy_into_bucket(i);  // unused here: zeros
    if constexpr (sharded) {
      for (auto& b : buckets_) finish_sharded_bucket(b);
      in_backward_ = false;
      return;
    }
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
      if (b.in_flight) {
        try {
          b.in_flight->wait();
        } catch (...) {  // the error that interrupted the backward has been reported already
        }
        b.in_flight.reset();
      }
      if constexpr (sharded) b.flat = b.reduced = at::Tensor();
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
  C* replicas_;                           // hybrid sharding: the same slices' processes in the other shard groups
  std::unique_ptr<bucket_hook<C>> hook_;  // replicated: how a bucket is reduced (none: all-reduced as it is)
  std::vector<std::string> names_;
  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> buffers_;
  std::vector<location> locations_;
  std::vector<bucket> buckets_;
  std::vector<at::Tensor> shard_gradients_;             // sharded: each parameter's, by index
  std::unordered_map<const void*, std::size_t> index_;  // sharded: a parameter's TensorImpl -> its index
  std::vector<bool> ready_;
  std::vector<bool> used_;
  std::mutex mutex_;
  std::size_t next_bucket_ = 0;
  std::uint64_t launched_count_ = 0;
  std::uint64_t overlapped_count_ = 0;
  std::uint64_t payload_elements_ = 0;
  std::uint64_t replica_elements_ = 0;
  std::uint64_t plain_bytes_ = 0;  // all-reduced without a hook
  bool sync_ = true;
  bool armed_ = true;
  bool in_backward_ = false;
  bool graph_done_ = false;
  bool warned_unused_ = false;
  after_accumulation hooks_;  // last: removed first, before what they call goes
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/reducer.ipp"
#endif
