/// \file
/// When `fully_sharded` gathers and lets go the parameters of each `accel::shard_unit` (an FSDP unit): gathered
/// before the unit's forward, the next unit's gather started meanwhile (prefetch, in the order of the last forward);
/// freed after the forward (`sharding_options::reshard_after_forward`); gathered again when the gradient of one of
/// its outputs arrives, the unit before it prefetched; freed once every one of its parameters has its gradient (its
/// backward is over, the reducer has its slices), or at the end of backward for those without one. The gathers run
/// on a communicator of their own, so that they never interleave with the reducer's reduce-scatters in an order
/// that differs between processes (a parameter unused on one process changes when its bucket is launched there).
// IWYU pragma: private, include <accel/sharded_data_parallel.hpp>
#pragma once

#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "../../collectives.hpp"
#include "../../options.hpp"
#include "owned_shards.hpp"
#include "unit_hooks.hpp"
#include "../gradient_sync/reducer.hpp"

namespace accel::detail {

/// The parameters of one unit: the shards that hold them (`group` in each), and the sharded parameters themselves.
struct unit_parameters {
  std::size_t group = 0;
  std::vector<owned_shards*> shards;
  std::vector<at::Tensor> parameters;
};

template <communicator C>
class unit_schedule final : public unit_hooks, public std::enable_shared_from_this<unit_schedule<C>> {
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

 public:
  unit_schedule(C& comm, const sharding_options& options, std::vector<unit_parameters> units)
      : comm_(comm),
        options_(options),
        units_(std::move(units)),
        next_(units_.size(), none),
        previous_(units_.size(), none),
        ready_(units_.size(), 0) {
    for (std::size_t u = 0; u < units_.size(); ++u)
      for (const auto& p : units_[u].parameters) hooks_.add(p, [this, u] { on_gradient_ready(u); });
  }
  unit_schedule(const unit_schedule&) = delete;
  unit_schedule& operator=(const unit_schedule&) = delete;

  /// Before each forward of a prepared model: the units' order is recorded afresh (the last one's says what to
  /// prefetch).
  void begin_forward() {
    if (order_.empty()) return;
    std::fill(next_.begin(), next_.end(), none);
    std::fill(previous_.begin(), previous_.end(), none);
    for (std::size_t i = 0; i + 1 < order_.size(); ++i) {
      if (next_[order_[i]] == none) next_[order_[i]] = order_[i + 1];
      if (previous_[order_[i + 1]] == none) previous_[order_[i + 1]] = order_[i];
    }
    order_.clear();
  }

  void before_unit_forward(std::size_t unit) override {
    order_.push_back(unit);
    gather(unit);
    if (options_.prefetch && next_[unit] != none) start_gather(next_[unit]);
  }
  void after_unit_forward(std::size_t unit, bool backward_hooked) override {
    if (options_.reshard_after_forward && backward_hooked) let_go(unit);
  }
  void before_unit_backward(std::size_t unit) override {
    std::lock_guard lock(mutex_);
    if (!in_backward_) {
      in_backward_ = true;
      std::weak_ptr<unit_schedule> self = this->shared_from_this();
      torch::autograd::Engine::get_default_engine().queue_callback([self] {
        if (const auto alive = self.lock()) alive->end_backward();
      });
    }
    gather(unit);
    if (options_.prefetch && previous_[unit] != none) start_gather(previous_[unit]);
  }

  /// The most units whose parameters were full, or on their way, at once (tests: two with prefetch and resharding).
  [[nodiscard]] std::size_t most_units_gathered() const noexcept { return most_units_gathered_; }
  /// How many units there are.
  [[nodiscard]] std::size_t size() const noexcept { return units_.size(); }

 private:
  /// After a unit parameter's gradient was accumulated: the last one lets the unit go.
  void on_gradient_ready(std::size_t unit) {
    std::lock_guard lock(mutex_);
    if (++ready_[unit] == units_[unit].parameters.size()) let_go(unit);
  }

  /// Once backward is over: the units some of whose parameters got no gradient go too.
  void end_backward() {
    std::lock_guard lock(mutex_);
    in_backward_ = false;
    std::fill(ready_.begin(), ready_.end(), 0);
    for (std::size_t u = 0; u < units_.size(); ++u) let_go(u);
  }

  void start_gather(std::size_t unit) {
    for (auto* shards : units_[unit].shards) shards->start_gather_group(units_[unit].group, comm_);
    count_gathered();
  }
  void gather(std::size_t unit) {
    for (auto* shards : units_[unit].shards) shards->gather_group(units_[unit].group, comm_);
    count_gathered();
  }
  void let_go(std::size_t unit) {
    for (auto* shards : units_[unit].shards) shards->free_group(units_[unit].group);
  }
  void count_gathered() {
    std::size_t gathered = 0;
    for (const auto& unit : units_)
      gathered += std::any_of(unit.shards.begin(), unit.shards.end(), [&unit](const owned_shards* shards) {
        return shards->gathering(unit.group) || shards->state(unit.group) == parameter_state::gathered;
      });
    most_units_gathered_ = std::max(most_units_gathered_, gathered);
  }

  C& comm_;
  sharding_options options_;
  std::vector<unit_parameters> units_;
  std::vector<std::size_t> order_;     // the units as this forward ran them
  std::vector<std::size_t> next_;      // the unit after each in the last forward (prefetched in forward)
  std::vector<std::size_t> previous_;  // the unit before each (prefetched in backward)
  std::vector<std::size_t> ready_;     // parameters with their gradient in this backward, per unit
  std::recursive_mutex mutex_;  // backward's hooks may run on the engine's threads (CUDA); gathers are collectives
  bool in_backward_ = false;
  std::size_t most_units_gathered_ = 0;
  after_accumulation hooks_;  // last: removed first, before what they call goes
};

}  // namespace accel::detail
