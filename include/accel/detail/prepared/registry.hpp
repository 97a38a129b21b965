/// \file
/// `prepared_registry`: what an accelerator prepared or was given to checkpoint (models, optimizers, checkpoint
/// slots), which `save_state`, `load_state`, `unscale_gradients` and `free_memory` go through.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../checkpoint/slot.hpp"

namespace accel::detail {

/// What a prepared object keeps while it lives: the registry holds the entry weakly, so it expires with the
/// object. Moving the prepared object moves the handle; the registered object itself stays where it is.
using registration = std::shared_ptr<const void>;

/// How `join_uneven_inputs` overrides a prepared range's `even_batches` (for its next pass): empty for a range
/// that cannot (a stream of samples, batches dispatched from process 0), as Accelerate's iterable loaders.
struct even_batches_switch {
  std::function<bool()> get = {};
  std::function<void(bool)> set = {};
};

class prepared_registry {
 public:
  /// Models are held (shared) until `release_prepared`: their weights are saved whether or not the user kept one.
  void add_model(std::shared_ptr<torch::nn::Module> module) { models_.push_back(std::move(module)); }
  [[nodiscard]] registration add_optimizer(torch::optim::Optimizer& optimizer) {
    return add(optimizers_, std::make_shared<torch::optim::Optimizer*>(&optimizer));
  }
  [[nodiscard]] registration add_slot(checkpoint_slot slot) {
    return add(slots_, std::make_shared<checkpoint_slot>(std::move(slot)));
  }
  [[nodiscard]] registration add_range(even_batches_switch range) {
    return add(ranges_, std::make_shared<even_batches_switch>(std::move(range)));
  }
  /// A slot the registry itself keeps (`register_for_checkpointing`): it outlives `release_prepared`.
  void keep_slot(checkpoint_slot slot) { kept_.push_back(add_slot(std::move(slot))); }

  [[nodiscard]] const std::vector<std::shared_ptr<torch::nn::Module>>& models() const noexcept { return models_; }
  [[nodiscard]] ACCEL_DECL std::vector<torch::optim::Optimizer*> optimizers() const;
  /// The live prepared ranges' even_batches switches, in preparation order.
  [[nodiscard]] ACCEL_DECL std::vector<std::shared_ptr<even_batches_switch>> ranges() const;
  /// The live slots by kind, each kind in registration order.
  [[nodiscard]] ACCEL_DECL std::map<std::string, std::vector<std::shared_ptr<checkpoint_slot>>> slots_by_kind() const;

  /// Forgets what `prepare` registered (`free_memory`); kept slots stay.
  ACCEL_DECL void release_prepared();

 private:
  template <class Entry>
  static registration add(std::vector<std::weak_ptr<Entry>>& entries, std::shared_ptr<Entry> entry) {
    std::erase_if(entries, [](const auto& weak) { return weak.expired(); });
    entries.push_back(entry);
    return entry;
  }

  std::vector<std::shared_ptr<torch::nn::Module>> models_;
  std::vector<std::weak_ptr<torch::optim::Optimizer*>> optimizers_;
  std::vector<std::weak_ptr<checkpoint_slot>> slots_;
  std::vector<std::weak_ptr<even_batches_switch>> ranges_;
  std::vector<registration> kept_;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/registry.ipp"
#endif
