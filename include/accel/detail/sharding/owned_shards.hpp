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
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../collectives.hpp"
#include "../support/parameter_encoding.hpp"
#include "optimizer_shards.hpp"
#include "storage.hpp"

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

/// What a gather is for: a forward (the parameters an encoding takes travel encoded) or the full parameters
/// themselves (checkpoints, unwrapping: every parameter in its own type).
enum class gather_purpose { forward, full };

/// An optimizer's shards with storage of their own, the full parameters gathered and let go by group. With a
/// `parameter_encoding`, the parameters it encodes are gathered for a forward in its type (their own buckets).
class owned_shards : public optimizer_shards {
 public:
  template <class IsPrepared>
  owned_shards(torch::optim::Optimizer& optimizer, int rank, int world, const bucket_options& limits,
               IsPrepared&& is_prepared, const std::function<std::size_t(const at::Tensor&)>& group_of = {},
               std::shared_ptr<parameter_encoding> encoding = nullptr,
               const std::function<at::Tensor(const at::Tensor&)>& constructed_slice = {})
      : optimizer_shards(optimizer, rank, world, limits, std::forward<IsPrepared>(is_prepared), true, group_of,
                         encodes(encoding.get()), constructed_slice),
        groups_(group_count_),
        encoding_(std::move(encoding)) {
    for (const auto& p : parameters_) {
      groups_[p.group].present = true;
      encoded_.push_back(encoding_ != nullptr && encoding_->encodes(p.full));
    }
    release();
  }
  ~owned_shards() {
    for (auto& group : groups_) wait_quietly(group);
  }

  /// The groups these shards hold parameters of, and where those parameters are.
  [[nodiscard]] ACCEL_DECL std::vector<std::size_t> groups() const;
  [[nodiscard]] bool holds_group(std::size_t group) const noexcept {
    return group < groups_.size() && groups_[group].present;
  }
  [[nodiscard]] parameter_state state(std::size_t group) const { return groups_.at(group).state; }
  /// The model parameters of `group` these shards hold.
  [[nodiscard]] ACCEL_DECL std::vector<at::Tensor> parameters_of(std::size_t group) const;
  /// Whether `group`'s gather was started and not finished (a prefetch).
  [[nodiscard]] bool gathering(std::size_t group) const { return groups_.at(group).gathering; }

  /// Starts all-gathering the full parameters of `group` from every process's slices, into storage of
  /// their own; nothing when they are full, or on their way, in a form that serves `purpose`. Group 0 goes through the
  /// buffers kept between steps, a bucket at a time, and is full on return; a unit's gather gets buffers of its own
  /// and stays in flight until `finish_gather_group` (so that it overlaps another unit's computation). For a forward,
  /// the parameters the encoding takes travel encoded, and hold their encoded elements decoded.
  template <communicator C>
  void start_gather_group(std::size_t group, C& comm, gather_purpose purpose = gather_purpose::forward) {
    if (!holds_group(group)) return;
    auto& g = groups_[group];
    const bool encode = purpose == gather_purpose::forward && encoding_ != nullptr;
    if (g.encoded && !encode) {  // encoded, wanted in full: gathered again
      finish_gather_group(group);
      forget_encoded(group);
      if (g.state == parameter_state::gathered) g.state = parameter_state::freed;
    }
    if (g.state == parameter_state::gathered || g.gathering) return;
    at::NoGradGuard no_grad;
    allocate_gathered(group);
    const auto gathered_elements = [this](std::size_t entry) { return parameters_[entry].gathered.view({-1}); };
    g.gathering = true;
    g.encoded = encode;
    for (const auto& bucket : buckets_) {
      if (bucket.group != group) continue;
      auto land =
          bucket.apart && encode ? launch_encoded_gather(bucket, comm)
          : group == 0
              ? launch_gather(bucket, comm, gathered_elements, false, [this](auto& b) { return kept_buffers(b); })
              : launch_gather(bucket, comm, gathered_elements, false, [this](auto& b) { return own_buffers(b); });
      if (group == 0)  // the kept buffers serve one bucket at a time
        land();
      else
        g.landing.push_back(std::move(land));
    }
    if (group == 0) finish_gather_group(group);
  }
  /// Waits for `group`'s gathers, if started; then each of its parameters holds its full elements.
  ACCEL_DECL void finish_gather_group(std::size_t group);
  template <communicator C>
  void gather_group(std::size_t group, C& comm, gather_purpose purpose = gather_purpose::forward) {
    start_gather_group(group, comm, purpose);
    finish_gather_group(group);
  }
  /// Every group gathered in full.
  template <communicator C>
  void materialize(C& comm) {
    for (const auto group : groups()) gather_group(group, comm, gather_purpose::full);
  }
  /// Frees the storage of `group`'s full parameters, which keep their shape (a unit after its forward, or
  /// its backward), once a gather in flight has landed.
  ACCEL_DECL void free_group(std::size_t group);
  /// Once the full parameters are stale (after the step): each parameter of `group` holds its slice only,
  /// sharing the shard's storage, so that at rest a parameter costs nothing beyond its shard.
  ACCEL_DECL void rest_group(std::size_t group);
  /// Every group at rest.
  void release() {
    for (const auto group : groups()) rest_group(group);
  }
  /// After the full parameters were written (a checkpoint loaded into them), each shard of a gathered group
  /// takes its slice (an at_rest group's parameters are the slices).
  ACCEL_DECL void take_slices_of_full();
  /// `parameter`'s full elements, gathered from every process's slice (one all-gather of padded chunks), when it is
  /// sharded and not gathered; null otherwise. A collective when not null: every process asks for the same
  /// parameters.
  template <communicator C>
  [[nodiscard]] std::optional<at::Tensor> gathered_parameter(const at::Tensor& parameter, C& comm) const {
    const auto found = index_.find(parameter.unsafeGetTensorImpl());
    if (found == index_.end()) return std::nullopt;
    const auto& p = parameters_[found->second];
    const auto& g = groups_[p.group];
    if (g.state == parameter_state::gathered && !(g.encoded && encoded_[found->second])) return std::nullopt;
    return gather_full(p.shard, p, comm);
  }

 private:
  /// A group's parameters, where they are and the gathers on their way.
  struct group_state {
    bool present = false;
    parameter_state state = parameter_state::gathered;
    bool gathering = false;                      // started, not finished
    bool encoded = false;                        // gathered (or on its way) for a forward, through the encoding
    std::vector<std::function<void()>> landing;  // each waits for a bucket's all-gather, then copies it out
  };
  /// Buffers of `bucket`'s own, let go once its gather has landed (a unit's, which may be in flight beside another).
  ACCEL_DECL std::pair<at::Tensor, at::Tensor> own_buffers(const gather_bucket& bucket) const;

  /// Waits for what `group` has in flight, ignoring its outcome (a collective that failed raised already).
  ACCEL_DECL static void wait_quietly(group_state& group) noexcept;

  /// What `optimizer_shards` sets apart in buckets of their own: the parameters `encoding` encodes.
  ACCEL_DECL static std::function<bool(const at::Tensor&)> encodes(const parameter_encoding* encoding);

  /// Each parameter of `group` gets storage for its full elements.
  ACCEL_DECL void allocate_gathered(std::size_t group);

  /// Starts the encoded all-gather of an `apart` bucket: one all-reduce of its members' maxima, then their slices
  /// encoded into one buffer of bytes, all-gathered; what it returns waits, then hands each member's full encoded
  /// elements to the encoding, and decoded to the parameter.
  template <communicator C>
  std::function<void()> launch_encoded_gather(const gather_bucket& bucket, C& comm) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> maxima;
    for (const auto m : bucket.members) maxima.push_back(encoding_->local_maximum(parameters_[m].shard));
    auto reduced = at::stack(maxima);
    comm.all_reduce(reduced, reduction::max).wait();
    all_gathered_bytes_ += static_cast<std::uint64_t>(reduced.numel()) * reduced.element_size();
    const auto bytes = parameters_[bucket.members.front()].shard.options().dtype(at::kByte);
    auto mine = at::zeros({bucket.segment}, bytes);  // the padding: zeros, the same on every process
    auto received = at::empty({bucket.segment * world_}, bytes);
    for (std::size_t k = 0; k < bucket.members.size(); ++k) {
      const auto& p = parameters_[bucket.members[k]];
      mine.narrow(0, bucket.offsets[k], p.span.length).copy_(encoding_->encode(p.shard, reduced[k]).view(at::kByte));
    }
    auto wait = count_launch(comm, received, mine);
    return [this, &bucket, wait, received, reduced] {
      wait();
      at::NoGradGuard copying_out;
      for (std::size_t k = 0; k < bucket.members.size(); ++k) {
        const auto& p = parameters_[bucket.members[k]];
        auto whole = at::empty({p.numel}, received.options());
        for (int r = 0; r < world_; ++r) {
          const auto span = shard_span_of(p.numel, r, world_);
          whole.narrow(0, span.begin, span.length)
              .copy_(received.narrow(0, r * bucket.segment + bucket.offsets[k], span.length));
        }
        const auto encoded = whole.view(encoding_->encoded_type()).view(p.sizes);
        p.gathered.copy_(encoding_->decode(encoded, reduced[k]));
        encoding_->gathered(p.full, encoded, reduced[k]);
      }
    };
  }

  /// The encoding forgets what it received of `group`'s parameters, which are no longer encoded.
  ACCEL_DECL void forget_encoded(std::size_t group);

  std::vector<group_state> groups_;
  std::shared_ptr<parameter_encoding> encoding_;
  std::vector<bool> encoded_;  // per entry of `parameters_`: the encoding takes it
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/owned_shards.ipp"
#endif
