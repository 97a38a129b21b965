/// \file
/// The shards of fully_sharded: each has storage of its own, and the model's parameter holds nothing more between a
/// step and the next forward (it is set to its slice, flat). The parameters are gathered and let go in groups: group
/// 0 holds those of no `accel::shard_unit`, gathered before the model's forward and let go after the step; group
/// u + 1 the u-th unit's, gathered around its forward and its backward (unit_schedule.hpp).
// IWYU pragma: private, include <accel/sharded_data_parallel.hpp>
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "../../collectives.hpp"
#include "optimizer_shards.hpp"

namespace accel::detail {

/// What a group's parameters hold.
enum class parameter_state {
  /// Their slices only, flat (between a step and the next forward).
  at_rest,
  /// Their full elements.
  gathered,
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

/// An optimizer's shards with storage of their own, the full parameters gathered and let go by group.
class owned_shards : public optimizer_shards {
 public:
  template <class IsPrepared>
  owned_shards(torch::optim::Optimizer& optimizer, int rank, int world, const bucket_options& limits,
               IsPrepared&& is_prepared, const std::function<std::size_t(const at::Tensor&)>& group_of = {})
      : optimizer_shards(optimizer, rank, world, limits, std::forward<IsPrepared>(is_prepared), true, group_of),
        groups_(group_count_) {
    for (const auto& p : parameters_) groups_[p.group].present = true;
    release();
  }
  ~owned_shards() {
    for (auto& group : groups_) wait_quietly(group);
  }

  /// The groups these shards hold parameters of, and where those parameters are.
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
  /// The model parameters of `group` these shards hold.
  [[nodiscard]] std::vector<at::Tensor> parameters_of(std::size_t group) const {
    std::vector<at::Tensor> members;
    for (const auto& p : parameters_)
      if (p.group == group) members.push_back(p.full);
    return members;
  }
  /// Whether `group`'s gather was started and not finished (a prefetch).
  [[nodiscard]] bool gathering(std::size_t group) const { return groups_.at(group).gathering; }

  /// Starts all-gathering the full parameters of `group` from every process's slices, into storage of
  /// their own; nothing when they are full, or on their way. Group 0 goes through the buffers kept between steps,
  /// a bucket at a time, and is full on return; a unit's gather gets buffers of its own and stays in flight until
  /// `finish_gather_group` (so that it overlaps another unit's computation).
  template <communicator C>
  void start_gather_group(std::size_t group, C& comm) {
    if (!holds_group(group)) return;
    auto& g = groups_[group];
    if (g.state == parameter_state::gathered || g.gathering) return;
    at::NoGradGuard no_grad;
    for (auto& p : parameters_) {
      if (p.group != group) continue;
      if (!p.gathered.defined())
        p.gathered = at::empty(p.sizes, p.shard.options());
      else
        reallocate_storage(p.gathered);
    }
    const auto gathered_elements = [this](std::size_t entry) { return parameters_[entry].gathered.view({-1}); };
    g.gathering = true;
    for (const auto& bucket : buckets_) {
      if (bucket.group != group) continue;
      if (group == 0)  // the kept buffers serve one bucket at a time
        launch_gather(bucket, comm, gathered_elements, false, [this](auto& b) { return kept_buffers(b); })();
      else
        g.landing.push_back(
            launch_gather(bucket, comm, gathered_elements, false, [this](auto& b) { return own_buffers(b); }));
    }
    if (group == 0) finish_gather_group(group);
  }
  /// Waits for `group`'s gathers, if started; then each of its parameters holds its full elements.
  void finish_gather_group(std::size_t group) {
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
  template <communicator C>
  void gather_group(std::size_t group, C& comm) {
    start_gather_group(group, comm);
    finish_gather_group(group);
  }
  /// Every group gathered.
  template <communicator C>
  void materialize(C& comm) {
    for (const auto group : groups()) gather_group(group, comm);
  }
  /// Frees the storage of `group`'s full parameters, which keep their shape (a unit after its forward, or
  /// its backward), once a gather in flight has landed.
  void free_group(std::size_t group) {
    finish_gather_group(group);
    if (!holds_group(group)) return;
    auto& g = groups_[group];
    if (g.state != parameter_state::gathered) return;
    for (auto& p : parameters_)
      if (p.group == group) free_storage(p.gathered);
    g.state = parameter_state::freed;
  }
  /// Once the full parameters are stale (after the step): each parameter of `group` holds its slice only,
  /// sharing the shard's storage, so that at rest a parameter costs nothing beyond its shard.
  void rest_group(std::size_t group) {
    finish_gather_group(group);
    if (!holds_group(group)) return;
    auto& g = groups_[group];
    if (g.state == parameter_state::at_rest) return;
    for (auto& p : parameters_) {
      if (p.group != group) continue;
      p.full.set_data(p.shard);
      if (p.gathered.defined()) free_storage(p.gathered);
    }
    g.state = parameter_state::at_rest;
  }
  /// Every group at rest.
  void release() {
    for (const auto group : groups()) rest_group(group);
  }
  /// After the full parameters were written (a checkpoint loaded into them), each shard of a gathered group
  /// takes its slice (an at_rest group's parameters are the slices).
  void take_slices_of_full() {
    at::NoGradGuard no_grad;
    for (auto& p : parameters_)
      if (groups_[p.group].state == parameter_state::gathered && p.gathered.defined())
        p.shard.copy_(p.gathered.reshape({-1}).narrow(0, p.span.begin, p.span.length));
  }
  /// `parameter`'s full elements, gathered from every process's slice (one all-gather of padded chunks), when it is
  /// sharded and not gathered; null otherwise. A collective when not null: every process asks for the same
  /// parameters.
  template <communicator C>
  [[nodiscard]] std::optional<at::Tensor> gathered_parameter(const at::Tensor& parameter, C& comm) const {
    const auto found = index_.find(parameter.unsafeGetTensorImpl());
    if (found == index_.end()) return std::nullopt;
    const auto& p = parameters_[found->second];
    if (groups_[p.group].state == parameter_state::gathered) return std::nullopt;
    return gather_full(p.shard, p, comm);
  }

 private:
  /// A group's parameters, where they are and the gathers on their way.
  struct group_state {
    bool present = false;
    parameter_state state = parameter_state::gathered;
    bool gathering = false;                      // started, not finished
    std::vector<std::function<void()>> landing;  // each waits for a bucket's all-gather, then copies it out
  };
  /// Buffers of `bucket`'s own, let go once its gather has landed (a unit's, which may be in flight beside another).
  std::pair<at::Tensor, at::Tensor> own_buffers(const gather_bucket& bucket) const {
    const auto options = parameters_[bucket.members.front()].shard.options();
    return {at::empty({bucket.segment}, options), at::empty({bucket.segment * world_}, options)};
  }

  /// Waits for what `group` has in flight, ignoring its outcome (a collective that failed raised already).
  static void wait_quietly(group_state& group) noexcept {
    for (auto& land : std::exchange(group.landing, {})) try {
        land();
      } catch (...) {
      }
    group.gathering = false;
  }

  std::vector<group_state> groups_;
};

}  // namespace accel::detail
