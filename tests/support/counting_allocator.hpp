// A CPU allocator that counts: installed in front of LibTorch's own, it records the bytes of CPU tensor storage
// currently allocated and their peak, so that tests assert memory from what was allocated rather than from RSS.
// Built with LibTorch 2.x only (its Allocator interface: a non-const allocate, copy_data).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>

namespace accel_test {

class counting_allocator final : public c10::Allocator {
 public:
  /// The process's counting allocator, installed in front of LibTorch's CPU allocator on first use and never
  /// removed (storage it handed out may outlive any scope; its deleter needs this object).
  static counting_allocator& installed() {
    static counting_allocator* const instance = new counting_allocator;
    return *instance;
  }
  counting_allocator(const counting_allocator&) = delete;
  counting_allocator& operator=(const counting_allocator&) = delete;

  c10::DataPtr allocate(std::size_t bytes) override {
    auto* block = new allocation{inner_->allocate(bytes), bytes, this};
    const auto now = current_.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
    for (auto peak = peak_.load(); now > peak && !peak_.compare_exchange_weak(peak, now);) {
    }
    void* data = block->inner.get();
    return {data, block, &release, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* destination, const void* source, std::size_t count) const {  // LibTorch 2.x's hook
    std::memcpy(destination, source, count);
  }

  /// Bytes of CPU tensor storage allocated through this allocator and not yet freed.
  [[nodiscard]] std::int64_t current() const noexcept { return current_.load(); }
  /// `current()` once it has stopped changing for `quiet` (waiting `limit` at most): Gloo's worker thread lets go of
  /// a finished collective's tensors just after the wait for it returns, so their storage may count for a moment.
  [[nodiscard]] std::int64_t settled(std::chrono::milliseconds quiet = std::chrono::milliseconds(20),
                                     std::chrono::milliseconds limit = std::chrono::seconds(2)) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    auto last = current();
    auto since = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() < deadline && std::chrono::steady_clock::now() - since < quiet) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (const auto now = current(); now != last) {
        last = now;
        since = std::chrono::steady_clock::now();
      }
    }
    return last;
  }
  /// The largest `current()` since construction or the last `reset_peak()`.
  [[nodiscard]] std::int64_t peak() const noexcept { return peak_.load(); }
  void reset_peak() noexcept { peak_.store(current_.load()); }

 private:
  struct allocation {
    c10::DataPtr inner;
    std::size_t bytes;
    counting_allocator* owner;
  };
  static void release(void* context) {
    auto* block = static_cast<allocation*>(context);
    block->owner->current_.fetch_sub(static_cast<std::int64_t>(block->bytes));
    delete block;  // frees the storage through LibTorch's allocator
  }

  counting_allocator() : inner_(c10::GetCPUAllocator()) {
    c10::SetAllocator(c10::DeviceType::CPU, this, /*priority=*/100);
  }

  c10::Allocator* inner_;
  std::atomic<std::int64_t> current_{0};
  std::atomic<std::int64_t> peak_{0};
};

}  // namespace accel_test
