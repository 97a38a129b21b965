/// \file
/// `accel::estimate_training_bytes`: the bytes one process holds to train a model under each parallel policy, from
/// the parameters' sizes alone (Accelerate's `accelerate estimate-memory`, with ZeRO's stages and the number of
/// processes besides). The formulas of docs/sharded.md's memory table, in one place: `accel estimate-memory` prints
/// them for a safetensors checkpoint, and `bigmodel.estimate.*` checks them against what accel's counting allocator
/// measures of a real training run under each policy. No LibTorch here: the command-line tool includes it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

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

  /// Held between steps: parameters, buckets, optimizer state (gradients released by `zero_grad`).
  [[nodiscard]] std::int64_t at_rest() const noexcept {
    return parameters_at_rest + gradient_buckets + optimizer_state;
  }
  /// Held at the end of a step's backward, besides activations and communication buffers in flight.
  [[nodiscard]] std::int64_t in_step() const noexcept {
    return parameters_in_step + gradients + gradient_buckets + optimizer_state + autocast_copies;
  }
};

/// The optimizer state tensors per element of LibTorch's elementwise optimizers, by Accelerate's and PyTorch's
/// names: adamw, adam (2), sgd (0), sgd_momentum, rmsprop, adagrad (1).
inline int optimizer_state_tensors(std::string_view optimizer) {
  if (optimizer == "adamw" || optimizer == "adam") return 2;
  if (optimizer == "sgd_momentum" || optimizer == "rmsprop" || optimizer == "adagrad") return 1;
  if (optimizer == "sgd") return 0;
  throw std::invalid_argument("accel: unknown optimizer '" + std::string(optimizer) +
                              "': the estimate knows adamw, adam, sgd, sgd_momentum, rmsprop and adagrad");
}

/// The bytes process `setup.process_index` of `setup.processes` holds to train parameters `tensors` under
/// `setup.stage`. A sharded stage splits each trainable tensor on its flattened elements in chunks of
/// ceil(n / P) (docs/sharded.md): the process owns its chunk's part of the elements. Gradient buckets hold one "used
/// here" flag per parameter besides its elements: data_parallel's and zero1's whole, zero2's and fully_sharded's
/// segments a whole chunk of each.
inline training_bytes estimate_training_bytes(std::span<const tensor_extent> tensors, const training_setup& setup) {
  if (setup.processes < 1 || setup.process_index < 0 || setup.process_index >= setup.processes)
    throw std::invalid_argument("accel::estimate_training_bytes: process " + std::to_string(setup.process_index) +
                                " of " + std::to_string(setup.processes) + " does not exist");
  const bool sharded_state = setup.stage != sharding_stage::data_parallel;
  const bool sharded_gradients = setup.stage == sharding_stage::zero2 || setup.stage == sharding_stage::fully_sharded;
  const bool sharded_parameters = setup.stage == sharding_stage::fully_sharded;
  training_bytes bytes;
  for (const auto& t : tensors) {
    const auto whole = t.elements * t.element_size;
    if (setup.autocast_16bit && t.floating_point && t.element_size == 4) bytes.autocast_copies += 2 * t.elements;
    if (!t.trainable) {
      bytes.parameters_at_rest += whole;
      bytes.parameters_in_step += whole;
      continue;
    }
    const auto chunk = (t.elements + setup.processes - 1) / setup.processes;
    const auto begin = std::min(t.elements, chunk * setup.process_index);
    const auto owned = (std::min(t.elements, begin + chunk) - begin) * t.element_size;
    bytes.parameters_at_rest += sharded_parameters ? owned : whole;
    bytes.parameters_in_step += sharded_parameters ? whole + owned : whole;
    bytes.gradients += sharded_gradients ? (chunk + 1) * t.element_size : whole;
    bytes.gradient_buckets += sharded_gradients ? 0 : whole + t.element_size;
    bytes.optimizer_state += setup.state_tensors * (sharded_state ? owned : whole);
  }
  return bytes;
}

}  // namespace accel
