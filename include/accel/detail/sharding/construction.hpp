/// \file
/// A sharded construction in progress (`accel::construct_sharded`): while it runs on a thread, each
/// `accel::shard_unit` built there keeps this process's slice of each of its trainable parameters as soon as the unit
/// is built, and lets the whole parameter's bytes go, so that the next unit is built beside slices only. The
/// parameters keep their full shape over storage of 0 bytes until fully_sharded's prepare takes the slices.
// IWYU pragma: private, include <accel/construct_sharded.hpp>
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "shard_layout.hpp"
#include "storage.hpp"

namespace accel::detail {

/// A parameter a shard unit sliced as it was built: the parameter (its full shape, no bytes) and this process's
/// slice of its flattened elements, with storage of its own.
struct constructed_slice {
  at::Tensor parameter;
  at::Tensor slice;
};

/// The sharded construction running on this thread, if any.
class slicing_construction;
inline slicing_construction*& construction_in_progress() noexcept {
  thread_local slicing_construction* current = nullptr;
  return current;
}

/// A sharded construction: in force on this thread from construction to destruction. `unit_init` (FSDP's
/// `param_init_fn`), when given, runs on each unit's module once it is built, before its slices are kept.
class slicing_construction {
 public:
  slicing_construction(int rank, int world, std::function<void(torch::nn::Module&)> unit_init)
      : rank_(rank), world_(world), unit_init_(std::move(unit_init)) {
    if (construction_in_progress() != nullptr)
      throw std::logic_error(
          "accel::construct_sharded: called inside another sharded construction; build the whole model in one");
    construction_in_progress() = this;
  }
  ~slicing_construction() { construction_in_progress() = nullptr; }
  slicing_construction(const slicing_construction&) = delete;
  slicing_construction& operator=(const slicing_construction&) = delete;

  /// Keeps this process's slice of each trainable parameter of the unit `module` that no unit inside it sliced
  /// already, and frees the whole parameter's bytes. Frozen parameters stay whole (fully_sharded replicates them).
  std::vector<constructed_slice> slice_unit(torch::nn::Module& module) {
    if (unit_init_) initialise(module);
    at::NoGradGuard no_grad;
    std::vector<constructed_slice> slices;
    for (const auto& item : module.named_parameters()) {
      const auto& p = item.value();
      if (!p.requires_grad() || sliced_.contains(p.unsafeGetTensorImpl())) continue;
      refuse_shared_storage(item.key(), p);
      const auto span = shard_span_of(p.numel(), rank_, world_);
      slices.push_back({p, p.detach().reshape({-1}).narrow(0, span.begin, span.length).clone()});
      sliced_.insert(p.unsafeGetTensorImpl());
    }
    for (const auto& kept : slices) free_storage(kept.parameter);
    return slices;
  }

 private:
  /// The per-unit initialiser, on a unit whose parameters all still hold their elements: a unit inside it, already
  /// sliced, would have it write into freed parameters.
  void initialise(torch::nn::Module& module) {
    for (const auto& p : module.parameters())
      if (sliced_.contains(p.unsafeGetTensorImpl()))
        throw std::invalid_argument(
            "accel::construct_sharded: a per-unit initialiser cannot run on a shard unit that holds another shard "
            "unit (whose parameters are sliced already); nest no units, or initialise in the module's constructor");
    unit_init_(module);
  }
  /// A parameter that is a view of a larger storage (parameters packed into one buffer) cannot let go of its bytes
  /// alone.
  static void refuse_shared_storage(const std::string& name, const at::Tensor& p) {
    const auto bytes = static_cast<std::size_t>(p.numel()) * p.element_size();
    if (p.storage_offset() != 0 || p.storage().nbytes() != bytes || !p.is_contiguous())
      throw std::invalid_argument("accel::construct_sharded: the parameter " + name +
                                  " of a shard unit shares its storage with other tensors (or is not contiguous), so "
                                  "its bytes cannot be let go alone; give it storage of its own");
  }

  int rank_;
  int world_;
  std::function<void(torch::nn::Module&)> unit_init_;
  std::unordered_set<const void*> sliced_;  // the TensorImpls sliced so far
};

}  // namespace accel::detail
