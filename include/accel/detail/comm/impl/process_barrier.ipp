/// \file
/// What process_barrier.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../process_barrier.hpp"

namespace accel::detail {

process_barrier_slot& process_barrier_registry() {
  static process_barrier_slot slot;
  return slot;
}

void register_process_barrier(std::function<void()> barrier) {
  auto& slot = process_barrier_registry();
  std::lock_guard lock(slot.mutex);
  if (!slot.barrier) slot.barrier = std::move(barrier);
}

std::function<void()> exchange_process_barrier(std::function<void()> barrier) {
  auto& slot = process_barrier_registry();
  std::lock_guard lock(slot.mutex);
  return std::exchange(slot.barrier, std::move(barrier));
}

std::function<void()> process_barrier() {
  auto& slot = process_barrier_registry();
  std::lock_guard lock(slot.mutex);
  return slot.barrier;
}

}  // namespace accel::detail
