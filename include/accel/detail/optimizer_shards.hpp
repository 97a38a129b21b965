/// \file
/// An optimizer re-pointed onto this process's shards: each trainable parameter is split on its flattened elements
/// (shard_layout.hpp), and the optimizer's parameter list holds this process's slices, so that the state it
/// allocates is this process's share only.
/// - Stages 1 and 2 (`shard_storage::view`): a slice is a view sharing the full parameter's storage; the step's
///   in-place update lands in the full parameter, whose other slices an all-gather then fills in.
/// - Stage 3 (`shard_storage::owned`): a slice has storage of its own, and the model's parameter holds nothing more
///   between a step and the next forward (it is set to its slice, flat). The parameters are gathered and let go in
///   groups: group 0 holds those of no `accel::shard_unit`, gathered before the model's forward and let go after the
///   step; group u + 1 the u-th unit's, gathered around its forward and its backward (detail/unit_schedule.hpp).
// IWYU pragma: private, include <accel/sharded_data_parallel.hpp>
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../collectives.hpp"
#include "../options.hpp"
#include "optimizer_state.hpp"
#include "reducer.hpp"
#include "shard_layout.hpp"

namespace accel::detail {

/// Whether a shard is a view of its full parameter (stages 1 and 2) or holds its elements itself (stage 3, where the
/// full parameter is let go between steps).
enum class shard_storage { view, owned };

/// Stage 3: what a group's parameters hold.
enum class parameter_state {
  /// Their slices only, flat (between a step and the next forward).
  at_rest,
  /// Their full elements.
  whole,
  /// Their full shape, over storage of 0 bytes: a unit after its forward, or after its backward. What autograd saved
  /// of them (views of that storage) sees their elements again once the group is gathered into the same storage.
  freed,
};

/// Frees `tensor`'s storage, keeping the storage object, so that the tensor and its views stay valid handles (FSDP's
/// way of letting go of parameters that autograd saved for backward).
inline void free_storage(const at::Tensor& tensor) {
  auto* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}
/// Gives a contiguous `tensor` whose storage `free_storage` freed its bytes again (uninitialised).
inline void reallocate_storage(const at::Tensor& tensor) {
  auto* storage = tensor.storage().unsafeGetStorageImpl();
  const auto bytes = static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

/// The shards of one optimizer on this process, and the all-gather that makes the full parameters whole again.
class optimizer_shards {
 public:
  /// Re-points `optimizer`'s trainable parameters onto this process's slices. `is_prepared` tells whether a
  /// parameter belongs to a model prepared before (so that every process holds process 0's values). With
  /// `shard_storage::owned` the full parameters are let go at once: `gather_group` before their next use, each in the
  /// group `group_of` gives it (none: all in group 0).
  template <class IsPrepared>
  optimizer_shards(torch::optim::Optimizer& optimizer, int rank, int world, const bucket_options& limits,
                   IsPrepared&& is_prepared, shard_storage storage = shard_storage::view,
                   const std::function<std::size_t(const at::Tensor&)>& group_of = {})
      : rank_(rank), world_(world) {
    if (!optimizer.state().empty())
      throw std::invalid_argument(
          "accel::prepare: this optimizer has stepped already (it holds state); a sharded policy splits the state "
          "across processes at prepare, so prepare the optimizer before its first step");
    auto& groups = optimizer.param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g)
      for (std::size_t k = 0; k < groups[g].params().size(); ++k) {
        auto& listed = groups[g].params()[k];
        if (!listed.requires_grad()) continue;  // frozen: stays whole, replicated
        const auto where = "parameter " + std::to_string(k) + " of parameter group " + std::to_string(g);
        if (!is_prepared(listed))
          throw std::invalid_argument("accel::prepare: " + where +
                                      " of this optimizer belongs to no prepared model; a sharded policy needs "
                                      "every process's model prepared (and broadcast) before its optimizer: "
                                      "acc.prepare(model, optimizer), the model first");
        if (!listed.is_contiguous())
          throw std::invalid_argument("accel::prepare: " + where +
                                      " is not contiguous, so it cannot be split into flat shards; make it "
                                      "contiguous before building the optimizer");
        auto [found, added] = index_.try_emplace(listed.unsafeGetTensorImpl(), parameters_.size());
        if (added) {
          const auto span = shard_span_of(listed.numel(), rank, world);
          auto slice = listed.detach().view({-1}).narrow(0, span.begin, span.length);
          parameters_.push_back({.full = listed,
                                 .shard = storage == shard_storage::owned ? slice.clone() : slice,
                                 .span = span,
                                 .sizes = listed.sizes().vec(),
                                 .numel = listed.numel(),
                                 .group = group_of ? group_of(listed) : 0,
                                 .whole = {}});
          const auto group = parameters_.back().group;
          if (groups_.size() <= group) groups_.resize(group + 1);
          groups_[group].present = true;
        }
        listings_.push_back({g, k, found->second});
        listed = parameters_[found->second].shard;
      }
    build_gather_buckets(limits);
    if (storage == shard_storage::owned) release();
  }
  optimizer_shards(const optimizer_shards&) = delete;
  optimizer_shards& operator=(const optimizer_shards&) = delete;
  ~optimizer_shards() {
    for (auto& group : groups_) wait_quietly(group);
  }

  /// Gives each shard its gradient, before anything reads the optimizer's gradients (unscale, step): the slice a
  /// reducer kept for it (`reduced(full parameter)`, stage 2), or else this process's slice of the full gradient
  /// (none where that has none).
  template <class Reduced>
  void attach_gradients(Reduced&& reduced) {
    for (auto& p : parameters_) {
      if (const at::Tensor* kept = reduced(p.full)) {
        p.shard.mutable_grad() = *kept;
        continue;
      }
      const auto& full = p.full.grad();
      p.shard.mutable_grad() =
          full.defined() ? full.reshape({-1}).narrow(0, p.span.begin, p.span.length) : at::Tensor();
    }
  }

  /// Clears the gradients the shards' are (views of): the full ones, and the slices `reduced` kept (stage 2).
  template <class Reduced>
  void zero_grad(bool set_to_none, Reduced&& reduced) {
    const auto clear = [set_to_none](at::Tensor& grad) {
      if (!grad.defined()) return;
      if (set_to_none) {
        grad = at::Tensor();
      } else {
        at::NoGradGuard no_grad;
        grad.zero_();
      }
    };
    for (auto& p : parameters_) {
      p.shard.mutable_grad() = at::Tensor();
      clear(p.full.mutable_grad());
      if (at::Tensor* kept = reduced(p.full)) clear(*kept);
    }
  }

  /// After this process stepped its shards: every process's updated slices, one all-gather per bucket, written into
  /// the full parameters (stages 1 and 2).
  template <communicator C>
  void gather(C& comm) {
    const auto full_elements = [this](std::size_t entry) { return parameters_[entry].full.detach().view({-1}); };
    for (const auto& bucket : buckets_)
      launch_gather(bucket, comm, full_elements, /*own_in_place=*/true, [this](auto& b) { return kept_buffers(b); })();
  }

  /// Stage 3: the groups these shards hold parameters of, and where those parameters are.
  [[nodiscard]] std::vector<std::size_t> groups() const {
    std::vector<std::size_t> held;
    for (std::size_t g = 0; g < groups_.size(); ++g)
      if (groups_[g].present) held.push_back(g);
    return held;
  }
  [[nodiscard]] bool holds_group(std::size_t group) const noexcept {
    return group < groups_.size() && groups_[group].present;
  }
  [[nodiscard]] parameter_state state(std::size_t group) const { return groups_.at(group).state; }
  /// Stage 3: the model parameters of `group` these shards hold.
  [[nodiscard]] std::vector<at::Tensor> parameters_of(std::size_t group) const {
    std::vector<at::Tensor> members;
    for (const auto& p : parameters_)
      if (p.group == group) members.push_back(p.full);
    return members;
  }
  /// Whether `group`'s gather was started and not finished (a prefetch).
  [[nodiscard]] bool gathering(std::size_t group) const { return groups_.at(group).gathering; }

  /// Stage 3: starts all-gathering the full parameters of `group` from every process's slices, into storage of
  /// their own; nothing when they are whole, or on their way. Group 0 goes through the buffers kept between steps,
  /// a bucket at a time, and is whole on return; a unit's gather gets buffers of its own and stays in flight until
  /// `finish_gather_group` (so that it overlaps another unit's computation).
  template <communicator C>
  void start_gather_group(std::size_t group, C& comm) {
    if (!holds_group(group)) return;
    auto& g = groups_[group];
    if (g.state == parameter_state::whole || g.gathering) return;
    at::NoGradGuard no_grad;
    for (auto& p : parameters_) {
      if (p.group != group) continue;
      if (!p.whole.defined())
        p.whole = at::empty(p.sizes, p.shard.options());
      else
        reallocate_storage(p.whole);
    }
    const auto whole_elements = [this](std::size_t entry) { return parameters_[entry].whole.view({-1}); };
    g.gathering = true;
    for (const auto& bucket : buckets_) {
      if (bucket.group != group) continue;
      if (group == 0)  // the kept buffers serve one bucket at a time
        launch_gather(bucket, comm, whole_elements, false, [this](auto& b) { return kept_buffers(b); })();
      else
        g.landing.push_back(
            launch_gather(bucket, comm, whole_elements, false, [this](auto& b) { return own_buffers(b); }));
    }
    if (group == 0) finish_gather_group(group);
  }
  /// Stage 3: waits for `group`'s gathers, if started; then each of its parameters holds its full elements.
  void finish_gather_group(std::size_t group) {
    if (!holds_group(group)) return;
    auto& g = groups_[group];
    if (!g.gathering) return;
    g.gathering = false;
    for (auto& land : std::exchange(g.landing, {})) land();
    if (g.state == parameter_state::at_rest)
      for (auto& p : parameters_)
        if (p.group == group) p.full.set_data(p.whole);
    g.state = parameter_state::whole;
  }
  template <communicator C>
  void gather_group(std::size_t group, C& comm) {
    start_gather_group(group, comm);
    finish_gather_group(group);
  }
  /// Stage 3: every group gathered.
  template <communicator C>
  void materialize(C& comm) {
    for (const auto group : groups()) gather_group(group, comm);
  }
  /// Stage 3: frees the storage of `group`'s full parameters, which keep their shape (a unit after its forward, or
  /// its backward), once a gather in flight has landed.
  void free_group(std::size_t group) {
    finish_gather_group(group);
    if (!holds_group(group)) return;
    auto& g = groups_[group];
    if (g.state != parameter_state::whole) return;
    for (auto& p : parameters_)
      if (p.group == group) free_storage(p.whole);
    g.state = parameter_state::freed;
  }
  /// Stage 3, once the full parameters are stale (after the step): each parameter of `group` holds its slice only,
  /// sharing the shard's storage, so that at rest a parameter costs nothing beyond its shard.
  void rest_group(std::size_t group) {
    finish_gather_group(group);
    if (!holds_group(group)) return;
    auto& g = groups_[group];
    if (g.state == parameter_state::at_rest) return;
    for (auto& p : parameters_) {
      if (p.group != group) continue;
      p.full.set_data(p.shard);
      if (p.whole.defined()) free_storage(p.whole);
    }
    g.state = parameter_state::at_rest;
  }
  /// Stage 3: every group at rest.
  void release() {
    for (const auto group : groups()) rest_group(group);
  }
  /// Stage 3: after the full parameters were written (a checkpoint loaded into them), each shard of a whole group
  /// takes its slice (an at_rest group's parameters are the slices).
  void take_slices_of_full() {
    at::NoGradGuard no_grad;
    for (auto& p : parameters_)
      if (groups_[p.group].state == parameter_state::whole && p.whole.defined())
        p.shard.copy_(p.whole.reshape({-1}).narrow(0, p.span.begin, p.span.length));
  }
  /// `parameter`'s whole elements, gathered from every process's slice (one all-gather of padded chunks), when it is
  /// sharded and not whole (stage 3); null otherwise. A collective when not null: every process asks for the same
  /// parameters.
  template <communicator C>
  [[nodiscard]] std::optional<at::Tensor> gathered_parameter(const at::Tensor& parameter, C& comm) const {
    const auto found = index_.find(parameter.unsafeGetTensorImpl());
    if (found == index_.end()) return std::nullopt;
    const auto& p = parameters_[found->second];
    if (groups_[p.group].state == parameter_state::whole) return std::nullopt;
    return gather_whole(p.shard, p, comm);
  }

  /// Runs `action` with `optimizer` (the one these shards were made from) listing the full parameters and holding
  /// their whole state, gathered from every process's shard: a collective, in which every process takes part and
  /// holds the whole state for the while. Then the optimizer lists and holds its shards again, as before.
  template <communicator C, class Action>
  void with_whole_state(torch::optim::Optimizer& optimizer, C& comm, Action&& action) {
    at::NoGradGuard no_grad;
    auto& state = optimizer.state();
    std::vector<std::pair<std::size_t, std::unique_ptr<torch::optim::OptimizerParamState>>> kept;
    const auto restore = [&] {
      for (auto& [entry, shard_state] : kept) {
        state.erase(compat::optimizer_state_key(parameters_[entry].full));
        state[compat::optimizer_state_key(parameters_[entry].shard)] = std::move(shard_state);
      }
      list(optimizer, &sharded_parameter::shard);
    };
    try {
      // A shard has state once its gradient was defined, which is so on every process alike.
      for (std::size_t entry = 0; entry < parameters_.size(); ++entry) {
        const auto& p = parameters_[entry];
        auto found = state.find(compat::optimizer_state_key(p.shard));
        if (found == state.end()) continue;
        auto whole = found->second->clone();
        if (!transform_state_tensors(*whole, [&](const at::Tensor& piece) { return gather_whole(piece, p, comm); }))
          throw std::invalid_argument(
              "accel::save_state: this optimizer's parameter state is not one of LibTorch's elementwise optimizers' "
              "(Adam, AdamW, SGD, RMSprop, Adagrad), so a sharded policy cannot gather it into a whole state");
        kept.emplace_back(entry, std::move(found->second));
        state.erase(found);
        state[compat::optimizer_state_key(p.full)] = std::move(whole);
      }
      list(optimizer, &sharded_parameter::full);
      action();
    } catch (...) {
      restore();
      throw;
    }
    restore();
  }

  /// Runs `load` with `optimizer` listing the full parameters, so that it loads a whole state (from any number of
  /// processes, or from `data_parallel`), then keeps this process's slice of each loaded state tensor: the optimizer
  /// lists and holds its shards again. No communication.
  template <class Load>
  void load_whole_state(torch::optim::Optimizer& optimizer, Load&& load) {
    at::NoGradGuard no_grad;
    auto& state = optimizer.state();
    const auto forget_whole = [&] {
      for (const auto& p : parameters_) state.erase(compat::optimizer_state_key(p.full));
      list(optimizer, &sharded_parameter::shard);
    };
    list(optimizer, &sharded_parameter::full);
    std::vector<std::pair<const sharded_parameter*, std::unique_ptr<torch::optim::OptimizerParamState>>> loaded;
    try {
      load();
      for (const auto& p : parameters_) {
        auto found = state.find(compat::optimizer_state_key(p.full));
        if (found == state.end()) continue;
        auto shard_state = found->second->clone();
        const bool known = transform_state_tensors(*shard_state, [&p](const at::Tensor& whole) {
          if (whole.numel() != p.numel)
            throw std::invalid_argument("a state tensor of " + std::to_string(whole.numel()) +
                                        " elements for a parameter of " + std::to_string(p.numel));
          return whole.reshape({-1}).narrow(0, p.span.begin, p.span.length).clone();
        });
        if (!known)
          throw std::invalid_argument(
              "its parameter state is not one of LibTorch's elementwise optimizers' (Adam, AdamW, SGD, RMSprop, "
              "Adagrad), so a sharded policy cannot split it");
        loaded.emplace_back(&p, std::move(shard_state));
      }
    } catch (...) {
      forget_whole();
      throw;
    }
    forget_whole();
    for (const auto& p : parameters_) state.erase(compat::optimizer_state_key(p.shard));  // replaced as a whole
    for (auto& [p, shard_state] : loaded) state[compat::optimizer_state_key(p->shard)] = std::move(shard_state);
  }

  /// This process's slice of `parameter` (flat, its current values) and its full shape, when it is one of the
  /// sharded parameters.
  [[nodiscard]] std::optional<parameter_shard> shard_of(const at::Tensor& parameter) const {
    const auto found = index_.find(parameter.unsafeGetTensorImpl());
    if (found == index_.end()) return std::nullopt;
    const auto& p = parameters_[found->second];
    return parameter_shard{.slice = p.shard, .sizes = p.sizes};
  }
  /// This process's span of `parameter` when it is one of the sharded parameters.
  [[nodiscard]] const shard_span* span_of(const at::Tensor& parameter) const {
    const auto found = index_.find(parameter.unsafeGetTensorImpl());
    return found == index_.end() ? nullptr : &parameters_[found->second].span;
  }
  /// This process's part of `parameter`'s gradient when it is one of the sharded parameters: its shard's attached
  /// gradient, else its slice of the full gradient (undefined, or empty, when there is none).
  [[nodiscard]] std::optional<at::Tensor> owned_gradient(const at::Tensor& parameter) const {
    const auto found = index_.find(parameter.unsafeGetTensorImpl());
    if (found == index_.end()) return std::nullopt;
    const auto& p = parameters_[found->second];
    if (p.shard.grad().defined()) return p.shard.grad();
    const auto& full = p.full.grad();
    return full.defined() ? full.reshape({-1}).narrow(0, p.span.begin, p.span.length) : at::Tensor();
  }
  /// All-gathers since construction: one per bucket per step (stage 3: per gather of a unit).
  [[nodiscard]] std::uint64_t all_gather_count() const noexcept { return all_gather_count_; }
  /// Elements the all-gathers since construction delivered (every process's padded slices).
  [[nodiscard]] std::uint64_t all_gathered_elements() const noexcept { return all_gathered_elements_; }
  [[nodiscard]] std::size_t bucket_count() const noexcept { return buckets_.size(); }
  /// Elements of the buffers the all-gathers keep between steps: per dtype and device, the largest bucket's slices
  /// sent and every process's received.
  [[nodiscard]] std::int64_t gather_buffer_elements() const noexcept {
    std::int64_t elements = 0;
    for (const auto& [kind, segment] : max_segment_) elements += segment * (world_ + 1);
    return elements;
  }
  /// Elements one all-gather of every bucket delivers (every process's padded slices): the full parameters plus
  /// padding; a step's, but for stage 3's units, gathered twice when resharded after forward.
  [[nodiscard]] std::int64_t gather_payload_elements() const noexcept {
    std::int64_t elements = 0;
    for (const auto& bucket : buckets_) elements += bucket.segment * world_;
    return elements;
  }

 private:
  struct sharded_parameter {
    at::Tensor full;   // the model's parameter
    at::Tensor shard;  // this process's slice of it, in the optimizer's list
    shard_span span;
    std::vector<std::int64_t> sizes;  // the full parameter's, which holds less while released (stage 3)
    std::int64_t numel = 0;
    std::size_t group = 0;  // stage 3: gathered and let go with the other parameters of its group
    at::Tensor whole;       // stage 3: its full elements while gathered (the parameter shares its storage)
  };
  /// Stage 3: a group's parameters, where they are and the gathers on their way.
  struct group_state {
    bool present = false;
    parameter_state state = parameter_state::whole;
    bool gathering = false;                      // started, not finished
    std::vector<std::function<void()>> landing;  // each waits for a bucket's all-gather, then copies it out
  };
  /// Where the optimizer lists a sharded parameter: group, position, entry of `parameters_`.
  struct listing {
    std::size_t group;
    std::size_t position;
    std::size_t entry;
  };

  /// Lists in `optimizer` the full parameters or their shards (`which`), where it listed the parameters.
  void list(torch::optim::Optimizer& optimizer, at::Tensor sharded_parameter::* which) {
    auto& groups = optimizer.param_groups();
    for (const auto& l : listings_) groups[l.group].params()[l.position] = parameters_[l.entry].*which;
  }

  /// Every process's slice of a state tensor of `p`, gathered into one of `p`'s shape.
  template <communicator C>
  at::Tensor gather_whole(const at::Tensor& piece, const sharded_parameter& p, C& comm) const {
    const auto chunk = shard_chunk(p.numel, world_);
    auto mine = at::zeros({chunk}, piece.options());
    mine.narrow(0, 0, piece.numel()).copy_(piece.reshape({-1}));
    auto all = at::empty({chunk * world_}, piece.options());
    comm.all_gather_into(all, mine).wait();
    return all.narrow(0, 0, p.numel).view(p.sizes);
  }
  /// Parameters gathered together: each process sends `segment` elements, parameter k's slice at `offsets[k]`
  /// (each padded to its chunk, so every process's slices lie at the same offsets).
  /// A `direct` bucket is one parameter whose elements split evenly (no padding) and of at least
  /// `direct_gather_bytes`: its all-gather goes straight from the slices into its full elements, without buffers or
  /// copies around it (for stages 1 and 2, in place: this process's slice is where it belongs).
  struct gather_bucket {
    std::vector<std::size_t> members;
    std::vector<std::int64_t> offsets;
    std::int64_t segment = 0;
    tensor_kind kind;
    std::size_t group = 0;
    bool direct = false;
  };
  static constexpr std::int64_t direct_gather_bytes = 1 << 20;

  /// The send and receive buffers of `bucket` among those kept from step to step: one pair per dtype and device,
  /// sized for the largest bucket kept, shared by the buckets (one all-gather at a time).
  std::pair<at::Tensor, at::Tensor> kept_buffers(const gather_bucket& bucket) {
    auto& buffers = gather_buffers_[bucket.kind];
    if (!buffers.first.defined()) {
      const auto options = parameters_[bucket.members.front()].shard.options();
      buffers = {at::empty({max_segment_[bucket.kind]}, options),
                 at::empty({max_segment_[bucket.kind] * world_}, options)};
    }
    return {buffers.first.narrow(0, 0, bucket.segment), buffers.second.narrow(0, 0, bucket.segment * world_)};
  }
  /// Buffers of `bucket`'s own, let go once its gather has landed (a unit's, which may be in flight beside another).
  std::pair<at::Tensor, at::Tensor> own_buffers(const gather_bucket& bucket) const {
    const auto options = parameters_[bucket.members.front()].shard.options();
    return {at::empty({bucket.segment}, options), at::empty({bucket.segment * world_}, options)};
  }

  /// Starts the all-gather of every process's slices of `bucket`'s members into `elements(entry)` (a flat tensor of
  /// all the elements of `parameters_[entry]`); what it returns waits for it. A direct bucket gathers straight into
  /// them; the others through `buffers_for(bucket)` (sent, received), each process's slice copied out at its span
  /// once received (but this process's own with `own_in_place`: it is there already).
  template <communicator C, class Elements, class BuffersFor>
  std::function<void()> launch_gather(const gather_bucket& bucket, C& comm, Elements elements, bool own_in_place,
                                      BuffersFor&& buffers_for) {
    at::NoGradGuard no_grad;
    if (bucket.direct) {  // in place: this process's slice where it belongs, then the others' around it
      const auto& p = parameters_[bucket.members.front()];
      auto whole = elements(bucket.members.front());
      auto mine = whole.narrow(0, p.span.begin, p.span.length);
      if (!mine.is_same(p.shard) && mine.data_ptr() != p.shard.data_ptr()) mine.copy_(p.shard);
      return count_launch(comm, whole, mine);
    }
    auto buffers = buffers_for(bucket);
    auto& [mine, gathered] = buffers;
    for (std::size_t k = 0; k < bucket.members.size(); ++k) {
      const auto& p = parameters_[bucket.members[k]];
      mine.narrow(0, bucket.offsets[k], p.span.length).copy_(p.shard);
    }
    auto wait = count_launch(comm, gathered, mine);
    return [this, &bucket, wait, buffers = std::move(buffers), elements = std::move(elements), own_in_place] {
      wait();
      at::NoGradGuard copying_out;
      const auto& received = buffers.second;
      for (int r = 0; r < world_; ++r) {
        if (own_in_place && r == rank_) continue;
        const auto segment = received.narrow(0, r * bucket.segment, bucket.segment);
        for (std::size_t k = 0; k < bucket.members.size(); ++k) {
          const auto& p = parameters_[bucket.members[k]];
          const auto span = shard_span_of(p.numel, r, world_);
          elements(bucket.members[k])
              .narrow(0, span.begin, span.length)
              .copy_(segment.narrow(0, bucket.offsets[k], span.length));
        }
      }
    };
  }
  /// Starts `comm.all_gather_into(gathered, mine)`, counted; returns what waits for it.
  template <communicator C>
  std::function<void()> count_launch(C& comm, at::Tensor& gathered, at::Tensor& mine) {
    auto work = std::make_shared<decltype(comm.all_gather_into(gathered, mine))>(comm.all_gather_into(gathered, mine));
    ++all_gather_count_;
    all_gathered_elements_ += static_cast<std::uint64_t>(gathered.numel());
    return [work] { work->wait(); };
  }
  /// Waits for what `group` has in flight, ignoring its outcome (a collective that failed raised already).
  static void wait_quietly(group_state& group) noexcept {
    for (auto& land : std::exchange(group.landing, {})) try {
        land();
      } catch (...) {
      }
    group.gathering = false;
  }

  /// Group 0's parameters in buckets capped as `limits` says, through the buffers kept between steps; each unit's
  /// (stage 3) in one bucket per dtype and device, gathered at once.
  void build_gather_buckets(const bucket_options& limits) {
    const bucket_options whole_unit{.first_bucket_mb = 1e12, .bucket_cap_mb = 1e12};
    for (std::size_t group = 0; group < groups_.size(); ++group) {
      std::vector<std::size_t> entries;
      std::vector<at::Tensor> fulls;
      for (std::size_t i = 0; i < parameters_.size(); ++i)
        if (parameters_[i].group == group) {
          entries.push_back(i);
          fulls.push_back(parameters_[i].full);
        }
      const auto add_bucket = [&](const std::vector<std::size_t>& members, bool direct) {
        gather_bucket bucket{.members = {}, .offsets = {}, .segment = 0, .kind = {}, .group = group, .direct = direct};
        for (auto i : members) {
          bucket.members.push_back(entries[i]);
          bucket.offsets.push_back(bucket.segment);
          bucket.segment += shard_chunk(parameters_[entries[i]].numel, world_);
        }
        bucket.kind = kind_of(parameters_[bucket.members.front()].full);
        if (group == 0 && !direct) max_segment_[bucket.kind] = std::max(max_segment_[bucket.kind], bucket.segment);
        buckets_.push_back(std::move(bucket));
      };
      // Large parameters that split evenly go alone and straight into place; the others in buckets.
      std::vector<std::size_t> bucketed;
      std::vector<at::Tensor> bucketed_fulls;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        const auto& full = fulls[i];
        if (full.numel() % world_ == 0 &&
            full.numel() * static_cast<std::int64_t>(full.element_size()) >= direct_gather_bytes)
          add_bucket({i}, true);
        else {
          bucketed.push_back(i);
          bucketed_fulls.push_back(full);
        }
      }
      for (auto& members : assign_buckets(bucketed_fulls, group == 0 ? limits : whole_unit)) {
        for (auto& m : members) m = bucketed[m];
        add_bucket(members, false);
      }
    }
  }

  int rank_;
  int world_;
  std::vector<sharded_parameter> parameters_;
  std::vector<listing> listings_;
  std::unordered_map<const void*, std::size_t> index_;  // a parameter's TensorImpl -> its entry (listed twice: one)
  std::vector<gather_bucket> buckets_;
  std::map<tensor_kind, std::int64_t> max_segment_;
  std::map<tensor_kind, std::pair<at::Tensor, at::Tensor>> gather_buffers_;  // sent, received
  std::vector<group_state> groups_;
  std::uint64_t all_gather_count_ = 0;
  std::uint64_t all_gathered_elements_ = 0;
};

}  // namespace accel::detail
