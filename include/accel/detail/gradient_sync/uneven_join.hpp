/// \file
/// Training on uneven inputs (Accelerate's `join_uneven_inputs`, PyTorch's `Join` with DDP's join hook). Within the
/// scope, each forward of a joined model with gradients enabled, on a process that still has data, is a round: one
/// all-reduce in which every process says whether it is still training and, if so, which model it runs and whether
/// that backward synchronises. A process that has run out of data ("joined") takes part in every round and, for a
/// synchronised one, shadows the collectives of that forward and backward (the buffer broadcast, then each gradient
/// bucket's all-reduce, of zeros), until a round finds no process training. The gradients of a step are then the
/// sum of the processes still training divided by the whole world size, as DDP's `divide_by_initial_world_size`.
// IWYU pragma: private, include <accel/parallel.hpp>
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../collectives.hpp"

namespace accel::detail {

/// One round as every process sees it, once summed.
struct join_round {
  std::vector<bool> training;          // by process
  std::vector<std::int64_t> forwards;  // by joined model: processes running its forward in this round
  std::vector<std::int64_t> syncs;     // by joined model: of those, the ones whose backward synchronises

  [[nodiscard]] ACCEL_DECL bool anyone_training() const;
  /// The highest process still training: whose buffers a forward broadcasts, as DDP's authoritative rank.
  [[nodiscard]] ACCEL_DECL int last_training() const;
};

/// The join of `Reducer`s (one per joined model) over communicator `C`. Neither copied nor moved: the parallel
/// policy keeps it for the scope.
template <communicator C, class Reducer>
class uneven_join {
 public:
  uneven_join(C& comm, std::vector<std::pair<const torch::nn::Module*, Reducer*>> models)
      : comm_(comm), models_(std::move(models)) {}
  uneven_join(const uneven_join&) = delete;
  uneven_join& operator=(const uneven_join&) = delete;

  /// The joined models, in the order given.
  [[nodiscard]] std::vector<const torch::nn::Module*> modules() const {
    std::vector<const torch::nn::Module*> modules;
    for (const auto& [module, reducer] : models_) modules.push_back(module);
    return modules;
  }
  /// The index of `module` among the joined models, or -1.
  [[nodiscard]] std::ptrdiff_t index_of(const torch::nn::Module& module) const {
    for (std::size_t m = 0; m < models_.size(); ++m)
      if (models_[m].first == &module) return static_cast<std::ptrdiff_t>(m);
    return -1;
  }

  /// A process still training runs a forward of joined model `model`, whose backward synchronises or not: tells
  /// every process. Returns the process whose buffers the forward broadcasts.
  int announce_forward(std::size_t model, bool synchronises) {
    const auto round = exchange(model, synchronises);
    return round.last_training();
  }

  /// This process has no more data: it answers every round, shadowing each synchronised forward and backward,
  /// until no process is training. Returns the last to join (the highest process training in the last round in
  /// which any was; the highest process when none ever was), whose model every process then takes.
  int shadow_until_all_joined() {
    for (;;) {
      const auto round = exchange(std::nullopt, false);
      if (!round.anyone_training()) return last_joiner_;
      for (std::size_t m = 0; m < models_.size(); ++m)
        if (round.syncs[m] > 0) models_[m].second->shadow_synchronised_step(round.last_training());
    }
  }

 private:
  /// One round: this process's part (training a model's forward, or joined) in, everyone's sum out.
  join_round exchange(std::optional<std::size_t> model, bool synchronises) {
    const auto P = static_cast<std::int64_t>(comm_.size());
    const auto M = static_cast<std::int64_t>(models_.size());
    auto counts = at::zeros({P + 2 * M}, at::kLong);
    if (model) {
      auto* c = counts.data_ptr<std::int64_t>();
      c[comm_.rank()] = 1;
      c[P + static_cast<std::int64_t>(*model)] = 1;
      c[P + M + static_cast<std::int64_t>(*model)] = synchronises ? 1 : 0;
    }
    comm_.all_reduce(counts, reduction::sum).wait();
    const auto* c = counts.data_ptr<std::int64_t>();
    join_round round{.training = std::vector<bool>(c, c + P),
                     .forwards = std::vector<std::int64_t>(c + P, c + P + M),
                     .syncs = std::vector<std::int64_t>(c + P + M, c + P + 2 * M)};
    check_agreement(round);
    if (round.anyone_training()) last_joiner_ = round.last_training();
    return round;
  }

  /// Every process still training must run the same joined model and agree on whether its backward synchronises,
  /// or some would wait for collectives the others never issue: raised on every process alike.
  void check_agreement(const join_round& round) const {
    std::int64_t training = 0;
    for (bool t : round.training) training += t ? 1 : 0;
    for (std::size_t m = 0; m < models_.size(); ++m) {
      if (round.forwards[m] == 0) continue;
      if (round.forwards[m] != training)
        throw std::logic_error(
            "accel::join_uneven_inputs: the processes still training ran the forwards of different models at the "
            "same point (" +
            std::to_string(round.forwards[m]) + " of " + std::to_string(training) + " ran joined model " +
            std::to_string(m) +
            "); every process must run the same joined models in the "
            "same order, each forward with gradients enabled followed by its backward");
      if (round.syncs[m] != 0 && round.syncs[m] != training)
        throw std::logic_error(
            "accel::join_uneven_inputs: " + std::to_string(round.syncs[m]) + " of the " + std::to_string(training) +
            " processes still training synchronise gradients in this backward and the others do not: with gradient "
            "accumulation, a process's last batch ends its window early (options::sync_with_dataloader), so uneven "
            "inputs end windows at different batches; set sync_with_dataloader = false, or keep even_batches");
    }
  }

  C& comm_;
  std::vector<std::pair<const torch::nn::Module*, Reducer*>> models_;
  int last_joiner_ = comm_.size() - 1;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/uneven_join.ipp"
#endif
