/// \file
/// What memory_estimate.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../memory_estimate.hpp"

namespace accel {

std::int64_t training_bytes::in_step() const noexcept {
  return parameters_in_step + gradients + gradient_buckets + optimizer_state + autocast_copies;
}

int optimizer_state_tensors(std::string_view optimizer) {
  if (optimizer == "adamw" || optimizer == "adam") return 2;
  if (optimizer == "sgd_momentum" || optimizer == "rmsprop" || optimizer == "adagrad") return 1;
  if (optimizer == "sgd") return 0;
  throw std::invalid_argument("accel: unknown optimizer '" + std::string(optimizer) +
                              "': the estimate knows adamw, adam, sgd, sgd_momentum, rmsprop and adagrad");
}
}  // namespace accel

namespace accel::detail {

tensor_slice owned_slice(const tensor_extent& t, const training_setup& setup) {
  const auto chunk = (t.elements + setup.processes - 1) / setup.processes;
  const auto begin = std::min(t.elements, chunk * setup.process_index);
  return {.owned_bytes = (std::min(t.elements, begin + chunk) - begin) * t.element_size, .chunk = chunk};
}

void add_shard_units(std::span<const tensor_extent> tensors, const training_setup& setup, training_bytes& bytes) {
  std::map<int, unit_extent> units;
  std::int64_t sliced = 0;  // the units' tensors: built whole, kept as this process's slices
  for (const auto& t : tensors) {
    if (!t.trainable || t.shard_unit < 0) continue;
    const auto slice = owned_slice(t, setup);
    auto& unit = units[t.shard_unit];
    unit.whole += t.elements * t.element_size;
    unit.bucket += setup.processes * (slice.chunk + 1) * t.element_size;
    sliced += t.elements * t.element_size - slice.owned_bytes;
  }
  if (units.empty()) return;
  unit_extent largest;
  for (const auto& [index, unit] : units) {
    largest.whole = std::max(largest.whole, unit.whole);
    largest.bucket = std::max(largest.bucket, unit.bucket);
  }
  bytes.unit_transients = 3 * largest.whole + 5 * largest.bucket;
  bytes.construction += largest.whole - sliced;
}
}  // namespace accel::detail

namespace accel {

training_bytes estimate_training_bytes(std::span<const tensor_extent> tensors, const training_setup& setup) {
  if (setup.processes < 1 || setup.process_index < 0 || setup.process_index >= setup.processes)
    throw std::invalid_argument("accel::estimate_training_bytes: process " + std::to_string(setup.process_index) +
                                " of " + std::to_string(setup.processes) + " does not exist");
  const bool sharded_state = setup.stage != sharding_stage::data_parallel;
  const bool sharded_gradients = setup.stage == sharding_stage::zero2 || setup.stage == sharding_stage::fully_sharded;
  const bool sharded_parameters = setup.stage == sharding_stage::fully_sharded;
  training_bytes bytes;
  for (const auto& t : tensors) {
    const auto whole = t.elements * t.element_size;
    bytes.construction += whole;
    if (setup.autocast_16bit && t.floating_point && t.element_size == 4) bytes.autocast_copies += 2 * t.elements;
    if (!t.trainable) {
      bytes.parameters_at_rest += whole;
      bytes.parameters_in_step += whole;
      continue;
    }
    const auto [owned, chunk] = detail::owned_slice(t, setup);
    const bool gathered_until_step = t.shard_unit < 0;
    bytes.parameters_at_rest += sharded_parameters ? owned : whole;
    bytes.parameters_in_step += sharded_parameters ? owned + (gathered_until_step ? whole : 0) : whole;
    bytes.gradients += sharded_gradients ? (chunk + 1) * t.element_size : whole;
    bytes.gradient_buckets += sharded_gradients ? 0 : whole + t.element_size;
    bytes.optimizer_state += setup.state_tensors * (sharded_state ? owned : whole);
  }
  if (sharded_parameters) detail::add_shard_units(tensors, setup, bytes);
  return bytes;
}

}  // namespace accel
