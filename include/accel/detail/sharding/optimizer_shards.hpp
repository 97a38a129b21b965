/// \file
/// An optimizer re-pointed onto this process's shards: each trainable parameter is split on its flattened elements
/// (shard_layout.hpp), and the optimizer's parameter list holds this process's slices, so that the state it
/// allocates is this process's share only. What both kinds of shards share: the re-pointing, the gradients
/// attached to the shards, the full optimizer state gathered for checkpoints and split on load, and the bucketed
/// all-gather of every process's slices. view_shards.hpp (zero1, zero2) and owned_shards.hpp (fully_sharded) add
/// what each does with the full parameters.
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

#include "../config.hpp"
#include "../../collectives.hpp"
#include "../../options.hpp"
#include "../support/optimizer_state.hpp"
#include "../gradient_sync/reducer.hpp"
#include "shard_layout.hpp"

namespace accel::detail {

/// The shards of one optimizer on this process, and the all-gather of every process's slices. A base: the full
/// parameters are kept full (view_shards) or let go between steps (owned_shards).
class optimizer_shards {
 public:
  optimizer_shards(const optimizer_shards&) = delete;
  optimizer_shards& operator=(const optimizer_shards&) = delete;

  /// Gives each shard its gradient, before anything reads the optimizer's gradients (unscale, step): the slice a
  /// reducer kept for it (`reduced(full parameter)`, zero2), or else this process's slice of the full gradient
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

  /// Clears the gradients the shards' are (views of): the full ones, and the slices `reduced` kept (zero2).
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

  /// Runs `action` with `optimizer` (the one these shards were made from) listing the full parameters and holding
  /// their full state, gathered from every process's shard: a collective, in which every process takes part and
  /// holds the full state for the while. Then the optimizer lists and holds its shards again, as before.
  template <communicator C, class Action>
  void with_full_state(torch::optim::Optimizer& optimizer, C& comm, Action&& action) {
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
        if (!transform_state_tensors(*whole, [&](const at::Tensor& piece) { return gather_full(piece, p, comm); }))
          throw std::invalid_argument(
              "accel::save_state: this optimizer's parameter state is not one of LibTorch's elementwise optimizers' "
              "(Adam, AdamW, SGD, RMSprop, Adagrad), so a sharded policy cannot gather it into a full state");
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

  /// Runs `load` with `optimizer` listing the full parameters, so that it loads a full state (from any number of
  /// processes, or from `data_parallel`), then keeps this process's slice of each loaded state tensor: the optimizer
  /// lists and holds its shards again. No communication.
  template <class Load>
  void load_full_state(torch::optim::Optimizer& optimizer, Load&& load) {
    at::NoGradGuard no_grad;
    auto& state = optimizer.state();
    const auto forget_full = [&] {
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
      forget_full();
      throw;
    }
    forget_full();
    for (const auto& p : parameters_) state.erase(compat::optimizer_state_key(p.shard));  // replaced as a whole
    for (auto& [p, shard_state] : loaded) state[compat::optimizer_state_key(p->shard)] = std::move(shard_state);
  }

  /// This process's slice of `parameter` (flat, its current values) and its full shape, when it is one of the
  /// sharded parameters.
  [[nodiscard]] ACCEL_DECL std::optional<parameter_shard> shard_of(const at::Tensor& parameter) const;
  /// This process's span of `parameter` when it is one of the sharded parameters.
  [[nodiscard]] ACCEL_DECL const shard_span* span_of(const at::Tensor& parameter) const;
  /// This process's part of `parameter`'s gradient when it is one of the sharded parameters: its shard's attached
  /// gradient, else its slice of the full gradient (undefined, or empty, when there is none).
  [[nodiscard]] ACCEL_DECL std::optional<at::Tensor> owned_gradient(const at::Tensor& parameter) const;
  /// All-gathers since construction: one per bucket per step (fully_sharded: per gather of a unit).
  [[nodiscard]] std::uint64_t all_gather_count() const noexcept { return all_gather_count_; }
  /// Elements the all-gathers since construction delivered (every process's padded slices).
  [[nodiscard]] std::uint64_t all_gathered_elements() const noexcept { return all_gathered_elements_; }
  /// Bytes the all-gathers since construction delivered: their elements times each one's size (an encoded gather,
  /// fully_sharded's float8 one, counts its encoded bytes), plus the maxima all-reduced before encoded gathers.
  [[nodiscard]] std::uint64_t all_gathered_bytes() const noexcept { return all_gathered_bytes_; }
  [[nodiscard]] std::size_t bucket_count() const noexcept { return buckets_.size(); }
  /// Elements of the buffers the all-gathers keep between steps: per dtype and device, the largest bucket's slices
  /// sent and every process's received.
  [[nodiscard]] ACCEL_DECL std::int64_t gather_buffer_elements() const noexcept;
  /// Elements one all-gather of every bucket delivers (every process's padded slices): the full parameters plus
  /// padding; a step's, but for fully_sharded's units, gathered twice when resharded after forward.
  [[nodiscard]] ACCEL_DECL std::int64_t gather_payload_elements() const noexcept;

 protected:
  template <class IsPrepared>
  optimizer_shards(torch::optim::Optimizer& optimizer, int rank, int world, const bucket_options& limits,
                   IsPrepared&& is_prepared, bool own_storage,
                   const std::function<std::size_t(const at::Tensor&)>& group_of,
                   const std::function<bool(const at::Tensor&)>& gathered_apart = {},
                   const std::function<at::Tensor(const at::Tensor&)>& constructed_slice = {})
      : rank_(rank), world_(world) {
    if (!optimizer.state().empty())
      throw std::invalid_argument(
          "accel::prepare: this optimizer has stepped already (it holds state); a sharded policy splits the state "
          "across processes at prepare, so prepare the optimizer before its first step");
    auto& groups = optimizer.param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g)
      for (std::size_t k = 0; k < groups[g].params().size(); ++k) {
        auto& listed = groups[g].params()[k];
        if (!listed.requires_grad()) continue;  // frozen: stays full, replicated
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
          // Built sliced (construct_sharded): the parameter holds no elements, its slice is kept apart.
          const auto constructed = constructed_slice ? constructed_slice(listed) : at::Tensor();
          auto slice =
              constructed.defined() ? constructed : listed.detach().view({-1}).narrow(0, span.begin, span.length);
          parameters_.push_back({.full = listed,
                                 .shard = own_storage && !constructed.defined() ? slice.clone() : slice,
                                 .span = span,
                                 .sizes = listed.sizes().vec(),
                                 .numel = listed.numel(),
                                 .group = group_of ? group_of(listed) : 0,
                                 .gathered = {}});
          group_count_ = std::max(group_count_, parameters_.back().group + 1);
        }
        listings_.push_back({g, k, found->second});
        listed = parameters_[found->second].shard;
      }
    build_gather_buckets(limits, gathered_apart);
  }
  ~optimizer_shards() = default;

  struct sharded_parameter {
    at::Tensor full;   // the model's parameter
    at::Tensor shard;  // this process's slice of it, in the optimizer's list
    shard_span span;
    std::vector<std::int64_t> sizes;  // the full parameter's, which holds less while released (fully_sharded)
    std::int64_t numel = 0;
    std::size_t group = 0;  // fully_sharded: gathered and let go with the other parameters of its group
    at::Tensor gathered;    // fully_sharded: its full elements while gathered (the parameter shares its storage)
  };
  /// Where the optimizer lists a sharded parameter: group, position, entry of `parameters_`.
  struct listing {
    std::size_t group;
    std::size_t position;
    std::size_t entry;
  };

  /// Lists in `optimizer` the full parameters or their shards (`which`), where it listed the parameters.
  ACCEL_DECL void list(torch::optim::Optimizer& optimizer, at::Tensor sharded_parameter::* which);

  /// Every process's slice of a state tensor of `p`, gathered into one of `p`'s shape.
  template <communicator C>
  at::Tensor gather_full(const at::Tensor& piece, const sharded_parameter& p, C& comm) const {
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
  /// copies around it (for view_shards, in place: this process's slice is where it belongs). An `apart` bucket holds
  /// parameters that may be gathered encoded (fully_sharded with a parameter_encoding), and no others.
  struct gather_bucket {
    std::vector<std::size_t> members;
    std::vector<std::int64_t> offsets;
    std::int64_t segment = 0;
    tensor_kind kind;
    std::size_t group = 0;
    bool direct = false;
    bool apart = false;
  };
  static constexpr std::int64_t direct_gather_bytes = 1 << 20;

  /// The send and receive buffers of `bucket` among those kept from step to step: one pair per dtype and device,
  /// sized for the largest bucket kept, shared by the buckets (one all-gather at a time).
  ACCEL_DECL std::pair<at::Tensor, at::Tensor> kept_buffers(const gather_bucket& bucket);
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
    all_gathered_bytes_ += static_cast<std::uint64_t>(gathered.numel()) * gathered.element_size();
    return [work] { work->wait(); };
  }
  /// Group 0's parameters in buckets capped as `limits` says, through the buffers kept between steps; each unit's
  /// (fully_sharded) in one bucket per dtype and device, gathered at once. The parameters `apart` takes are bucketed
  /// among themselves.
  ACCEL_DECL void build_gather_buckets(const bucket_options& limits,
                                       const std::function<bool(const at::Tensor&)>& apart);

  int rank_;
  int world_;
  std::vector<sharded_parameter> parameters_;
  std::vector<listing> listings_;
  std::unordered_map<const void*, std::size_t> index_;  // a parameter's TensorImpl -> its entry (listed twice: one)
  std::vector<gather_bucket> buckets_;
  std::map<tensor_kind, std::int64_t> max_segment_;
  std::map<tensor_kind, std::pair<at::Tensor, at::Tensor>> gather_buffers_;  // sent, received
  std::size_t group_count_ = 0;                                              // one more than the largest group number
  std::uint64_t all_gather_count_ = 0;
  std::uint64_t all_gathered_elements_ = 0;
  std::uint64_t all_gathered_bytes_ = 0;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/optimizer_shards.ipp"
#endif
