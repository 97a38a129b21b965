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

#include "../config.hpp"
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
ACCEL_DECL slicing_construction*& construction_in_progress() noexcept;

/// A sharded construction: in force on this thread from construction to destruction. `unit_init` (FSDP's
/// `param_init_fn`), when given, runs on each unit's module once it is built, before its slices are kept.
class slicing_construction {
 public:
  ACCEL_DECL slicing_construction(int rank, int world, std::function<void(torch::nn::Module&)> unit_init);
  ~slicing_construction() { construction_in_progress() = nullptr; }
  slicing_construction(const slicing_construction&) = delete;
  slicing_construction& operator=(const slicing_construction&) = delete;

  /// Keeps this process's slice of each trainable parameter of the unit `module` that no unit inside it sliced
  /// already, and frees the whole parameter's bytes. Frozen parameters stay whole (fully_sharded replicates them).
  ACCEL_DECL std::vector<constructed_slice> slice_unit(torch::nn::Module& module);

 private:
  /// The per-unit initialiser, on a unit whose parameters all still hold their elements: a unit inside it, already
  /// sliced, would have it write into freed parameters.
  ACCEL_DECL void initialise(torch::nn::Module& module);
  /// A parameter that is a view of a larger storage (parameters packed into one buffer) cannot let go of its bytes
  /// alone.
  ACCEL_DECL static void refuse_shared_storage(const std::string& name, const at::Tensor& p);

  int rank_;
  int world_;
  std::function<void(torch::nn::Module&)> unit_init_;
  std::unordered_set<const void*> sliced_;  // the TensorImpls sliced so far
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/construction.ipp"
#endif
