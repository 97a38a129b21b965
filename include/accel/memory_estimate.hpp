/// \file
/// `accel::estimate_training_bytes`: the bytes one process holds to train a model under each parallel policy, from
/// the parameters' sizes alone (Accelerate's `accelerate estimate-memory`, with ZeRO's stages and the number of
/// processes besides). The formulas of docs/sharded.md's memory table, in one place: `accel estimate-memory` prints
/// them for a safetensors checkpoint, and `bigmodel.estimate.*` checks them against what accel's counting allocator
/// measures of a real training run under each policy, and `bigmodel.limits.*` against the peaks of processes under
/// cgroup memory limits (shard units, construction and loading). No LibTorch here: the command-line tool includes it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "detail/config.hpp"

namespace accel {

/// The parallel policies whose memory differs: `data_parallel`, `zero1`, `zero2` and `fully_sharded` (without shard
/// units: the whole model gathered from forward to step).
enum class sharding_stage { data_parallel, zero1, zero2, fully_sharded };

/// One parameter tensor: its elements, the bytes of one, and whether an optimizer trains it (frozen parameters and
/// integer tensors stay whole, without gradient or state).
struct tensor_extent {
  std::int64_t elements = 0;
  std::int64_t element_size = 4;
  bool trainable = true;
  bool floating_point = true;  ///< what autocast may cast
  /// The `accel::shard_unit` that holds it under `fully_sharded` (any number, the same for one unit's tensors; the
  /// innermost unit where units nest), or -1: outside every unit, gathered with the model's root.
  int shard_unit = -1;
};

/// What the estimate is for.
struct training_setup {
  sharding_stage stage = sharding_stage::data_parallel;
  int processes = 1;
  int process_index = 0;  ///< process 0 owns the largest slices: its figures bound every process's
  /// Optimizer state tensors per parameter element, each of the parameter's dtype: AdamW and Adam 2, SGD with
  /// momentum, RMSprop and Adagrad 1, plain SGD 0 (`optimizer_state_tensors`).
  int state_tensors = 2;
  /// bf16 or fp16 autocast (`accel::bf16`, `accel::fp16`): the float32 master weights stay, and the forward keeps a
  /// 2-byte cast of each float32 weight it uses until it ends.
  bool autocast_16bit = false;
};

/// Bytes one process holds, by what holds them.
struct training_bytes {
  std::int64_t parameters_at_rest = 0;  ///< between an optimizer step and the next forward
  std::int64_t parameters_in_step = 0;  ///< from the forward to the step
  std::int64_t gradients = 0;           ///< what a synchronised backward leaves allocated
  std::int64_t gradient_buckets = 0;    ///< persistent all-reduce buckets, flags included (data_parallel, zero1)
  std::int64_t optimizer_state = 0;     ///< after the first step
  std::int64_t autocast_copies = 0;     ///< the forward's 16-bit casts of float32 weights, at most
  /// `fully_sharded` with shard units, during forward and backward besides `in_step()`: two units gathered (the one
  /// computing, the next one's gather on its way), one unit's gradients whole, and five of its gradient buckets
  /// (one filling, two being reduce-scattered and their receive buffers); the largest unit's figures.
  std::int64_t unit_transients = 0;
  /// The peak of building the model: the whole model, but for `fully_sharded` with shard units, built by
  /// `accel::construct_sharded`: its slices of the units, the largest unit whole, and every tensor outside units
  /// and every frozen one whole.
  std::int64_t construction = 0;

  /// Held between steps: parameters, buckets, optimizer state (gradients released by `zero_grad`).
  [[nodiscard]] std::int64_t at_rest() const noexcept {
    return parameters_at_rest + gradient_buckets + optimizer_state;
  }
  /// Held at the end of a step's backward, besides activations and communication buffers in flight.
  [[nodiscard]] ACCEL_DECL std::int64_t in_step() const noexcept;
  /// The most a step holds at once, activations and the all-gather buffers of non-unit buckets aside.
  [[nodiscard]] std::int64_t step_peak() const noexcept { return in_step() + unit_transients; }
  /// The peak of `load_state` of a checkpoint (either format) into the prepared model between steps: what is held
  /// at rest (the weights are read straight into the parameters at rest, no copy beside them), its optimizer state
  /// as read, and the state it replaces, kept serialised until the load commits (a load is all or nothing). A
  /// program that builds its model to load into peaks at the larger of this and `construction`.
  [[nodiscard]] std::int64_t loading() const noexcept { return at_rest() + 2 * optimizer_state; }
};

/// The optimizer state tensors per element of LibTorch's elementwise optimizers, by Accelerate's and PyTorch's
/// names: adamw, adam (2), sgd (0), sgd_momentum, rmsprop, adagrad (1).
ACCEL_DECL int optimizer_state_tensors(std::string_view optimizer);

namespace detail {

/// This process's bytes of a trainable tensor's slice, and its chunk's elements (ceil(n / P)).
struct tensor_slice {
  std::int64_t owned_bytes = 0;
  std::int64_t chunk = 0;
};

ACCEL_DECL tensor_slice owned_slice(const tensor_extent& t, const training_setup& setup);

/// One shard unit's trainable tensors: their bytes whole (gathered, or as built), and its gradient bucket's (P
/// segments each of a chunk of every tensor and its flag).
struct unit_extent {
  std::int64_t whole = 0;
  std::int64_t bucket = 0;
};

/// The shard units of `fully_sharded`: what a step holds of them for a moment (`unit_transients`), and the peak of
/// building them one after another (`construction`, where `bytes.construction` holds the whole model's bytes).
ACCEL_DECL void add_shard_units(std::span<const tensor_extent> tensors, const training_setup& setup,
                                training_bytes& bytes);

}  // namespace detail

/// The bytes process `setup.process_index` of `setup.processes` holds to train parameters `tensors` under
/// `setup.stage`. A sharded stage splits each trainable tensor on its flattened elements in chunks of
/// ceil(n / P) (docs/sharded.md): the process owns its chunk's part of the elements. Gradient buckets hold one "used
/// here" flag per parameter besides its elements: data_parallel's and zero1's whole, zero2's and fully_sharded's
/// segments a whole chunk of each. Under `fully_sharded`, a shard unit's tensors are gathered for their unit's
/// forward and backward only (`unit_transients`), the others from the forward to the step.
ACCEL_DECL training_bytes estimate_training_bytes(std::span<const tensor_extent> tensors, const training_setup& setup);

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/memory_estimate.ipp"
#endif
