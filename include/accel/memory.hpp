/// \file
/// Memory: how much is allocated, `accel::memory_stats(device)` (PyTorch's `memory_allocated()`,
/// `max_memory_allocated()`, `reset_peak_memory_stats()`: the device caching allocator's counters, or on the CPU
/// accel's counting allocator, turned on by `accel::count_cpu_memory()`); running out of it and going on:
/// `accel::find_executable_batch_size` (Accelerate's), which retries a training function at 90% of the batch size
/// each time it runs out of memory; `should_reduce_batch_size`, the test it applies; `clear_device_cache`, what it
/// (and `acc.free_memory()`) calls to give the device's cached memory back.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "detail/config.hpp"
#include "collectives.hpp"
#include "detail/compat.hpp"
#include "detail/support/counting_allocator.hpp"
#include "detail/support/text.hpp"

namespace accel {

/// `find_executable_batch_size` tried every batch size down to 1 and each ran out of memory.
struct batch_size_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Gives the memory LibTorch's device caching allocator holds unused back to the device (Accelerate's
/// `clear_device_cache`; CUDA's cache, or another accelerator's, where present; nothing to do on the CPU).
inline void clear_device_cache() { detail::compat::empty_device_cache(); }

/// Bytes of tensor storage on a device, from `accel::memory_stats(device)`: PyTorch's `torch.cuda.memory_allocated()`,
/// `max_memory_allocated()`, `memory_reserved()` and `max_memory_reserved()`.
struct memory_statistics {
  /// Bytes of storage allocated and not yet freed.
  std::int64_t allocated = 0;
  /// The largest `allocated` since the program started or the last `reset_peak_memory_stats`.
  std::int64_t peak_allocated = 0;
  /// Bytes the allocator holds, allocated or cached for reuse (CUDA's caching allocator); on the CPU, which caches
  /// nothing, `allocated`.
  std::int64_t reserved = 0;
  /// The largest `reserved`, as `peak_allocated`.
  std::int64_t peak_reserved = 0;
};

namespace detail {
/// The counting allocator `count_cpu_memory()` installed, or null before.
ACCEL_DECL std::atomic<counting_cpu_allocator*>& installed_cpu_counter() noexcept;
}  // namespace detail

/// Counts CPU tensor storage from now on, for `memory_stats(cpu)`: puts accel's counting allocator in front of
/// LibTorch's CPU allocator, for the rest of the process (storage allocated before is not counted, and is freed as
/// before). Opt in, as a lock and a table entry per allocation cost a little; idempotent and thread-safe. Throws
/// `std::logic_error` when another CPU allocator of higher priority is installed (`c10::SetAllocator`).
ACCEL_DECL void count_cpu_memory();

/// Whether `count_cpu_memory()` turned the counting of CPU storage on.
[[nodiscard]] inline bool counting_cpu_memory() noexcept { return detail::installed_cpu_counter().load() != nullptr; }

/// The bytes of tensor storage allocated on `device` (see `memory_statistics`). A GPU (an accelerator's device):
/// LibTorch's caching allocator's counters, where this LibTorch reaches them (see detail/compat.hpp). The CPU: what
/// was allocated since `count_cpu_memory()` (call it first, or this throws `std::logic_error` saying so). Another
/// device, or a GPU this LibTorch cannot read, throws `std::invalid_argument`.
[[nodiscard]] ACCEL_DECL memory_statistics memory_stats(const c10::Device& device);

/// Starts the peaks of `device` again from what is allocated now (PyTorch's `reset_peak_memory_stats`, and
/// `reset_max_memory_allocated`). Throws as `memory_stats` does.
ACCEL_DECL void reset_peak_memory_stats(const c10::Device& device);

namespace detail {
/// What LibTorch's errors say when memory ran out but their type does not (Accelerate's `should_reduce_batch_size`
/// list, plus the form a CUDA kernel launch reports).
inline constexpr std::string_view out_of_memory_messages[] = {
    " out of memory.",                                    // CUDA's caching allocator, HIP, XPU
    "CUDA error: out of memory",                          // a CUDA call that ran out (c10::Error)
    "MPS backend out of memory",                          // MPS
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",           // cuDNN refusing a batch too large for it
    "DefaultCPUAllocator: can't allocate memory",         // LibTorch's CPU allocator (1.13 and 2.x: a c10::Error)
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  // HPU
};

ACCEL_DECL bool mentions_out_of_memory(std::string_view message);
}  // namespace detail

/// Whether `error` means that memory ran out, so that a smaller batch may fit: by type, `std::bad_alloc` (`new`)
/// and `c10::OutOfMemoryError` (CUDA's caching allocator); by message, the other `c10::Error`s that LibTorch throws
/// for it: its CPU allocator's ("DefaultCPUAllocator: can't allocate memory", a plain `c10::Error` in 1.13 and 2.x),
/// a CUDA call's "out of memory", MPS's, and cuDNN's CUDNN_STATUS_NOT_SUPPORTED, as Accelerate's
/// `should_reduce_batch_size`. Any other error, or none, is false.
[[nodiscard]] ACCEL_DECL bool should_reduce_batch_size(const std::exception_ptr& error) noexcept;

namespace detail {
/// What the batch-size search returns: `f`'s result, by value.
template <class F>
using batch_result_t = std::remove_cvref_t<std::invoke_result_t<F&, int>>;

/// The batch size after one that ran out of memory: int(0.9 * size), Accelerate's step (computed in double, as
/// Python does, so the sequence is the same: 128, 115, 103, ... 9, 8, ... 1, 0).
[[nodiscard]] constexpr int reduced_batch_size(int batch_size) noexcept { return static_cast<int>(batch_size * 0.9); }

/// How one attempt ended on one process; ordered by how much it decides (the largest over the processes wins).
enum class attempt_outcome : int { succeeded = 0, out_of_memory = 1, failed = 2 };

/// How the attempt ended across the job: the largest outcome, and the first process that had it.
struct job_outcome {
  attempt_outcome outcome;
  int process;
};

/// One attempt's result, or the error it threw (void results hold nothing).
template <class R>
struct batch_attempt {
  using stored = std::conditional_t<std::is_void_v<R>, std::monostate, R>;
  std::optional<stored> result;
  std::exception_ptr error;

  [[nodiscard]] attempt_outcome outcome() const noexcept {
    if (!error) return attempt_outcome::succeeded;
    return should_reduce_batch_size(error) ? attempt_outcome::out_of_memory : attempt_outcome::failed;
  }
};

template <class F>
batch_attempt<batch_result_t<F>> attempt_batch_size(F& f, int batch_size) {
  batch_attempt<batch_result_t<F>> attempt;
  try {
    if constexpr (std::is_void_v<batch_result_t<F>>) {
      std::invoke(f, batch_size);
      attempt.result.emplace();
    } else {
      attempt.result.emplace(std::invoke(f, batch_size));
    }
  } catch (...) {
    attempt.error = std::current_exception();
  }
  return attempt;
}

/// The last attempt that ran out of memory on the job: its batch size, the first process it happened on, and the
/// error when that is this one.
struct out_of_memory_record {
  int batch_size = 0;
  int process = 0;
  std::exception_ptr error;
};

/// An error's message for another message: its first line (LibTorch's without the backtrace).
ACCEL_DECL std::string error_summary(const std::exception_ptr& error);

/// Throws `batch_size_error` once the sizes ran out: the message names the last out-of-memory error, which is
/// nested in it (`std::rethrow_if_nested`) when it happened on this process.
[[noreturn]] ACCEL_DECL void throw_no_batch_size_left(int starting_batch_size, const out_of_memory_record& last);

/// The batch size after `batch_size` ran out of memory, from `reduce` (Accelerate's `reduce_batch_size_fn`, given the
/// size that failed): it must be smaller.
template <class Reduce>
int next_batch_size(Reduce& reduce, int batch_size) {
  const int next = std::invoke(reduce, batch_size);
  if (next >= batch_size)
    throw std::invalid_argument("accel::find_executable_batch_size: reduce_batch_size returned " +
                                std::to_string(next) + " after batch size " + std::to_string(batch_size) +
                                " ran out of memory; it must return a smaller batch size (0 or less ends the search)");
  return next;
}

/// Accelerate's loop: `f(batch_size)` from `starting_batch_size` down by `reduce` while the job runs out of memory.
/// `agree(outcome)` turns this process's outcome into the job's (itself on one process; a collective on several).
template <class F, class Agree, class Reduce>
batch_result_t<F> search_batch_size(F& f, int starting_batch_size, Agree&& agree, Reduce& reduce) {
  if (starting_batch_size < 1)
    throw std::invalid_argument("accel::find_executable_batch_size: starting_batch_size is " +
                                std::to_string(starting_batch_size) +
                                "; it must be at least 1 (the search goes down from it, 10% per attempt)");
  clear_device_cache();
  out_of_memory_record last;
  for (int batch_size = starting_batch_size; batch_size > 0; batch_size = next_batch_size(reduce, batch_size)) {
    {
      auto attempt = attempt_batch_size(f, batch_size);
      const auto here = attempt.outcome();
      const job_outcome job = agree(here);  // on every process, whatever happened here, so that none waits
      if (here == attempt_outcome::failed) std::rethrow_exception(attempt.error);
      if (job.outcome == attempt_outcome::failed)
        throw collective_error("accel::find_executable_batch_size: process " + std::to_string(job.process) +
                               " failed at batch size " + std::to_string(batch_size) +
                               " with an error other than running out of memory (that process reports it); this "
                               "process stops too, so that the job does not wait for it");
      if (job.outcome == attempt_outcome::succeeded) {
        if constexpr (std::is_void_v<batch_result_t<F>>)
          return;
        else
          return std::move(*attempt.result);
      }
      // Only the error is kept (what LibTorch throws for it holds its message, no tensors), for the final message.
      last = {batch_size, job.process, here == attempt_outcome::out_of_memory ? attempt.error : nullptr};
    }  // the attempt, with whatever its result held, is gone before the cache is emptied
    clear_device_cache();
  }
  throw_no_batch_size_left(starting_batch_size, last);
}

/// The job's outcome from every process's: `acc.gather` of one number per process (on the accelerator's device, as
/// NCCL needs).
template <class Accelerator>
job_outcome agree_on_outcome(Accelerator& acc, attempt_outcome here) {
  if (acc.num_processes() == 1) return {here, 0};
  const auto mine = at::full({1}, static_cast<int>(here), at::TensorOptions().dtype(at::kInt).device(acc.device()));
  const auto all = acc.gather(mine).cpu();
  const auto* outcomes = all.template data_ptr<int>();
  const auto worst = std::max_element(outcomes, outcomes + all.numel());
  return {static_cast<attempt_outcome>(*worst), static_cast<int>(worst - outcomes)};
}

/// What the multi-process search needs of an accelerator: the processes and a gather.
template <class A>
concept batch_size_agreement = requires(A& acc, const at::Tensor& tensor) {
  { acc.num_processes() } -> std::convertible_to<int>;
  acc.device();
  { acc.gather(tensor) } -> std::convertible_to<at::Tensor>;
};
}  // namespace detail

/// Calls `f(batch_size)` and returns its result; when `f` runs out of memory (`should_reduce_batch_size`: CUDA's
/// allocator, LibTorch's CPU allocator, `std::bad_alloc`), empties the device cache and calls it again at
/// int(0.9 * batch_size), as Accelerate's `find_executable_batch_size`: 128, 115, 103, 92, ... 9, 8, ... 1. Reaching
/// 0 throws `batch_size_error`, which names the last out-of-memory error and nests it (`std::rethrow_if_nested`);
/// any other error leaves `f` untouched, at once. `f` should build everything sized by the batch (the data loader,
/// say) from its argument, so that a retry starts afresh; its result comes back by value.
///
///     auto loss = accel::find_executable_batch_size([&](int batch_size) { return train(batch_size); }, 128);
///
/// One process only: with several, call the overload that takes the accelerator, so that the processes agree.
template <class F>
  requires std::invocable<F&, int>
detail::batch_result_t<F> find_executable_batch_size(F&& f, int starting_batch_size = 128) {
  return detail::search_batch_size(
      f, starting_batch_size, [](detail::attempt_outcome here) { return detail::job_outcome{here, 0}; },
      detail::reduced_batch_size);
}

/// The same with the next batch size from `reduce_batch_size(size that ran out)` instead of 90% of it (Accelerate's
/// `reduce_batch_size_fn`, which takes no argument: a C++ callable is given the size): it must return a smaller
/// size, and 0 or less ends the search.
///
///     accel::find_executable_batch_size(train, 128, [](int size) { return size / 2; });  // 128, 64, 32, ...
template <class F, class Reduce>
  requires std::invocable<F&, int> && std::is_invocable_r_v<int, Reduce&, int>
detail::batch_result_t<F> find_executable_batch_size(F&& f, int starting_batch_size, Reduce&& reduce_batch_size) {
  return detail::search_batch_size(
      f, starting_batch_size, [](detail::attempt_outcome here) { return detail::job_outcome{here, 0}; },
      reduce_batch_size);
}

/// The same on every process of `acc`'s job, which agree on the batch size: after each attempt the processes gather
/// how it ended, and all step down together when any ran out of memory (a process whose `f` succeeded then runs it
/// again, at the smaller size, with the others). When one process's `f` fails otherwise, that process rethrows its
/// error and the others throw `collective_error` naming it. A free function, as Accelerate's (in `accelerate.utils`),
/// taking the accelerator only for the agreement: it works with any accelerator and keeps `accelerator` itself
/// smaller. A `reduce_batch_size` must return the same on every process.
///
///     accel::find_executable_batch_size(acc, [&](int batch_size) { train(acc, batch_size); }, 128);
///
/// The limit: the agreement is a collective after `f`, so a collective inside `f` that another process never reaches
/// (it ran out of memory before it) meets that process's agreement instead, or nothing: it fails or waits until
/// `options::timeout`. Keep `f`'s collectives after what may run out of memory, or accept that an out-of-memory there
/// ends the job after the timeout.
template <detail::batch_size_agreement Accelerator, class F>
  requires std::invocable<F&, int>
detail::batch_result_t<F> find_executable_batch_size(Accelerator& acc, F&& f, int starting_batch_size = 128) {
  return detail::search_batch_size(
      f, starting_batch_size, [&](detail::attempt_outcome here) { return detail::agree_on_outcome(acc, here); },
      detail::reduced_batch_size);
}

/// The same with `reduce_batch_size` choosing each next size (see the one-process overload).
template <detail::batch_size_agreement Accelerator, class F, class Reduce>
  requires std::invocable<F&, int> && std::is_invocable_r_v<int, Reduce&, int>
detail::batch_result_t<F> find_executable_batch_size(Accelerator& acc, F&& f, int starting_batch_size,
                                                     Reduce&& reduce_batch_size) {
  return detail::search_batch_size(
      f, starting_batch_size, [&](detail::attempt_outcome here) { return detail::agree_on_outcome(acc, here); },
      reduce_batch_size);
}

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/memory.ipp"
#endif
