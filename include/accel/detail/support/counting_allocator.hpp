/// \file
/// `counting_cpu_allocator`: a CPU allocator in front of another (LibTorch's), counting the bytes of storage it
/// handed out that are still alive, and their peak; what `accel::count_cpu_memory()` installs for
/// `accel::memory_stats` on the CPU.
///
/// Memory may be freed through an allocator other than the one that allocated it: LibTorch's `raw_deallocate` frees
/// through the deleter of whichever CPU allocator is installed *now*, so a block allocated before this one was
/// installed comes back through it (a wrapper that assumed it made every block it frees crashes there), and a block
/// it made may come back through one installed in front of it later. So every block it makes is recorded by address,
/// with the inner allocator's own `DataPtr`, in a table that every counting allocator shares; a block none of them
/// made is handed to the deleter of the allocator the first was installed in front of, uncounted. Its data and context
/// are one pointer, as LibTorch's `raw_allocate` requires, and the records and the allocators are never destroyed:
/// storage may outlive any scope, even `main`.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../compat.hpp"

namespace accel::detail {

class counting_cpu_allocator final : public compat::allocator_interface<counting_cpu_allocator> {
 public:
  /// In front of `inner` (LibTorch's CPU allocator when installed): every block comes from it.
  ACCEL_DECL explicit counting_cpu_allocator(c10::Allocator* inner);
  counting_cpu_allocator(const counting_cpu_allocator&) = delete;
  counting_cpu_allocator& operator=(const counting_cpu_allocator&) = delete;

  /// `bytes` from the inner allocator, counted until freed (an empty block is not counted: it has no address).
  ACCEL_DECL c10::DataPtr allocate_bytes(std::size_t bytes) const;
  /// Frees any block, this allocator's or not (`raw_deallocate`).
  [[nodiscard]] c10::DeleterFnPtr raw_deleter() const override { return &release; }

  /// Bytes allocated through this allocator and not yet freed.
  [[nodiscard]] std::int64_t current() const noexcept { return current_.load(); }
  /// The largest `current()` since construction or the last `reset_peak()`.
  [[nodiscard]] std::int64_t peak() const noexcept { return peak_.load(); }
  void reset_peak() noexcept { peak_.store(current_.load()); }

 private:
  struct record {
    c10::DataPtr inner;
    std::size_t bytes;
    const counting_cpu_allocator* owner;
  };
  /// Each live block's records, by address: one per counting allocator it went through, the outermost (the one
  /// whose `DataPtr` the user holds, freed first) last. Never destroyed: blocks are freed during static destruction.
  ACCEL_DECL static std::unordered_map<void*, std::vector<record>>& records();
  ACCEL_DECL static std::mutex& records_mutex();
  /// The raw deleter of the allocator the first counting allocator was put in front of: it frees the blocks made
  /// before (LibTorch's CPU allocator's).
  ACCEL_DECL static std::atomic<c10::DeleterFnPtr>& foreign_deleter();

  ACCEL_DECL static void release(void* data);

  c10::Allocator* inner_;
  mutable std::atomic<std::int64_t> current_{0};
  mutable std::atomic<std::int64_t> peak_{0};
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/counting_allocator.ipp"
#endif
