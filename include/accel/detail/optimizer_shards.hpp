/// \file
/// An optimizer re-pointed onto this process's shards: each trainable parameter is split on its flattened elements
/// (shard_layout.hpp), and the optimizer's parameter list holds this process's slices, so that the state it
/// allocates is this process's share only.
/// - Stages 1 and 2 (`shard_storage::view`): a slice is a view sharing the full parameter's storage; the step's
///   in-place update lands in the full parameter, whose other slices an all-gather then fills in.
/// - Stage 3 (`shard_storage::owned`): a slice has storage of its own, and the model's parameter holds nothing more
///   between a step and the next forward (it is set to its slice, flat); `materialize` all-gathers the full
///   parameters before use and `release` lets them go after the step.
// IWYU pragma: private, include <accel/sharded_data_parallel.hpp>
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
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
#include "reducer.hpp"
#include "shard_layout.hpp"

namespace accel::detail {

/// Replaces each state tensor of a LibTorch optimizer's parameter state by `transform(tensor)` (Adam, AdamW, SGD,
/// RMSprop, Adagrad: elementwise optimizers, whose state tensors have their parameter's elements); false for a state
/// of another type.
template <class Transform>
bool transform_state_tensors(torch::optim::OptimizerParamState& state, Transform&& transform) {
  const auto apply = [&transform](at::Tensor& tensor) {
    if (tensor.defined()) tensor = transform(tensor);
  };
  const auto moments = [&apply](auto& adam) {  // Adam's and AdamW's states: the same fields, unrelated types
    apply(adam.exp_avg());
    apply(adam.exp_avg_sq());
    apply(adam.max_exp_avg_sq());
  };
  if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    moments(*adamw);
  } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
    moments(*adam);
  } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    apply(sgd->momentum_buffer());
  } else if (auto* rmsprop = dynamic_cast<torch::optim::RMSpropParamState*>(&state)) {
    apply(rmsprop->square_avg());
    apply(rmsprop->momentum_buffer());
    apply(rmsprop->grad_avg());
  } else if (auto* adagrad = dynamic_cast<torch::optim::AdagradParamState*>(&state)) {
    apply(adagrad->sum());
  } else {
    return false;
  }
  return true;
}

/// Whether a shard is a view of its full parameter (stages 1 and 2) or holds its elements itself (stage 3, where the
/// full parameter is let go between steps).
enum class shard_storage { view, owned };

/// The shards of one optimizer on this process, and the all-gather that makes the full parameters whole again.
class optimizer_shards {
 public:
  /// Re-points `optimizer`'s trainable parameters onto this process's slices. `is_prepared` tells whether a
  /// parameter belongs to a model prepared before (so that every process holds process 0's values). With
  /// `shard_storage::owned` the full parameters are released at once: `materialize` before their next use.
  template <class IsPrepared>
  optimizer_shards(torch::optim::Optimizer& optimizer, int rank, int world, const bucket_options& limits,
                   IsPrepared&& is_prepared, shard_storage storage = shard_storage::view)
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
                                 .numel = listed.numel()});
        }
        listings_.push_back({g, k, found->second});
        listed = parameters_[found->second].shard;
      }
    build_gather_buckets(limits);
    if (storage == shard_storage::owned) release();
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
    all_gather_slices(comm, [this](std::size_t entry, int r) -> std::optional<at::Tensor> {
      if (r == rank_) return std::nullopt;  // stepped in place
      return parameters_[entry].full.detach().view({-1});
    });
  }

  /// Stage 3, before the full parameters are used: gives each one its whole elements again, in storage of its own
  /// gathered from every process's slice (one all-gather per bucket). Nothing when they are whole already.
  template <communicator C>
  void materialize(C& comm) {
    if (!released_) return;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> whole;
    for (const auto& p : parameters_) whole.push_back(at::empty(p.sizes, p.shard.options()));
    all_gather_slices(
        comm, [&whole](std::size_t entry, int) -> std::optional<at::Tensor> { return whole[entry].view({-1}); });
    for (std::size_t i = 0; i < parameters_.size(); ++i) parameters_[i].full.set_data(whole[i]);
    released_ = false;
  }
  /// Stage 3, once the full parameters are stale (after the step): each holds its slice only, sharing the shard's
  /// storage, so that at rest a parameter costs nothing beyond its shard.
  void release() {
    for (auto& p : parameters_) p.full.set_data(p.shard);
    released_ = true;
  }
  /// Stage 3: after the full parameters were written (a checkpoint loaded into them), each shard takes its slice.
  void take_slices_of_full() {
    if (released_) return;  // the full parameters are the slices
    at::NoGradGuard no_grad;
    for (auto& p : parameters_) p.shard.copy_(p.full.detach().reshape({-1}).narrow(0, p.span.begin, p.span.length));
  }
  /// Whether the full parameters hold their slices only (stage 3, between a step and the next forward).
  [[nodiscard]] bool released() const noexcept { return released_; }
  /// `parameter`'s whole elements, gathered from every process's slice (one all-gather of padded chunks), when it is
  /// sharded and released; null otherwise. A collective when not null: every process asks for the same parameters.
  template <communicator C>
  [[nodiscard]] std::optional<at::Tensor> gathered_parameter(const at::Tensor& parameter, C& comm) const {
    const auto found = index_.find(parameter.unsafeGetTensorImpl());
    if (!released_ || found == index_.end()) return std::nullopt;
    const auto& p = parameters_[found->second];
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
  /// All-gathers since construction: one per bucket per step.
  [[nodiscard]] std::uint64_t all_gather_count() const noexcept { return all_gather_count_; }
  [[nodiscard]] std::size_t bucket_count() const noexcept { return buckets_.size(); }
  /// Elements of the buffers the all-gathers keep between steps: per dtype and device, the largest bucket's slices
  /// sent and every process's received.
  [[nodiscard]] std::int64_t gather_buffer_elements() const noexcept {
    std::int64_t elements = 0;
    for (const auto& [kind, segment] : max_segment_) elements += segment * (world_ + 1);
    return elements;
  }
  /// Elements each step's all-gathers deliver (every process's padded slices): the full parameters plus padding.
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
    comm.all_gather_into(all, mine);
    return all.narrow(0, 0, p.numel).view(p.sizes);
  }
  /// Parameters gathered together: each process sends `segment` elements, parameter k's slice at `offsets[k]`
  /// (each padded to its chunk, so every process's slices lie at the same offsets).
  struct gather_bucket {
    std::vector<std::size_t> members;
    std::vector<std::int64_t> offsets;
    std::int64_t segment = 0;
    tensor_kind kind;
  };

  /// One all-gather per bucket of every process's slices; process r's slice of each member goes into
  /// `destination(entry, r)` (a flat tensor of the elements of `parameters_[entry]`) at its span, unless that gives
  /// none.
  template <communicator C, class Destination>
  void all_gather_slices(C& comm, Destination&& destination) {
    at::NoGradGuard no_grad;
    for (auto& bucket : buckets_) {
      auto& buffers = gather_buffers_[bucket.kind];  // kept from step to step, shared by the buckets of a kind
      if (!buffers.first.defined()) {
        const auto options = parameters_[bucket.members.front()].shard.options();
        buffers = {at::empty({max_segment_[bucket.kind]}, options),
                   at::empty({max_segment_[bucket.kind] * world_}, options)};
      }
      auto mine = buffers.first.narrow(0, 0, bucket.segment);
      auto gathered = buffers.second.narrow(0, 0, bucket.segment * world_);
      for (std::size_t k = 0; k < bucket.members.size(); ++k) {
        const auto& p = parameters_[bucket.members[k]];
        mine.narrow(0, bucket.offsets[k], p.span.length).copy_(p.shard);
      }
      comm.all_gather_into(gathered, mine);
      for (int r = 0; r < world_; ++r) {
        const auto segment = gathered.narrow(0, r * bucket.segment, bucket.segment);
        for (std::size_t k = 0; k < bucket.members.size(); ++k) {
          const auto& p = parameters_[bucket.members[k]];
          const auto target = destination(bucket.members[k], r);
          if (!target) continue;
          const auto span = shard_span_of(p.numel, r, world_);
          target->narrow(0, span.begin, span.length).copy_(segment.narrow(0, bucket.offsets[k], span.length));
        }
      }
      ++all_gather_count_;
    }
  }

  void build_gather_buckets(const bucket_options& limits) {
    std::vector<at::Tensor> fulls;
    for (const auto& p : parameters_) fulls.push_back(p.full);
    for (auto& members : assign_buckets(fulls, limits)) {
      gather_bucket bucket{.members = std::move(members), .offsets = {}, .segment = 0, .kind = {}};
      for (auto i : bucket.members) {
        bucket.offsets.push_back(bucket.segment);
        bucket.segment += shard_chunk(parameters_[i].numel, world_);
      }
      bucket.kind = kind_of(parameters_[bucket.members.front()].full);
      max_segment_[bucket.kind] = std::max(max_segment_[bucket.kind], bucket.segment);
      buckets_.push_back(std::move(bucket));
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
  std::uint64_t all_gather_count_ = 0;
  bool released_ = false;
};

}  // namespace accel::detail
