/// \file
/// The job's barrier, for code that must wait for every process without knowing the backend: the logger's
/// `in_order` option (accel/logging.hpp). The first process group the process creates (parallel.hpp's
/// `detail::process_group`) registers its barrier here; until then there is none.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <functional>
#include <mutex>
#include <utility>

#include "../config.hpp"

namespace accel::detail {

/// The registered barrier and the mutex that guards it (a logger may run on any thread).
struct process_barrier_slot {
  std::mutex mutex;
  std::function<void()> barrier;
};

ACCEL_DECL process_barrier_slot& process_barrier_registry();

/// Registers `barrier` as the job's, unless one is already registered (the first process group wins: it is the one
/// every later accelerator shares).
ACCEL_DECL void register_process_barrier(std::function<void()> barrier);

/// Replaces the registered barrier (empty: none) and returns the previous one: for tests, which stand a counting
/// barrier in for the process group's, or take it away.
ACCEL_DECL std::function<void()> exchange_process_barrier(std::function<void()> barrier);

/// The registered barrier; empty when no process group exists yet.
[[nodiscard]] ACCEL_DECL std::function<void()> process_barrier();

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/process_barrier.ipp"
#endif
