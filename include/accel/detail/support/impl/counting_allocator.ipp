/// \file
/// What counting_allocator.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../counting_allocator.hpp"

namespace accel::detail {

counting_cpu_allocator::counting_cpu_allocator(c10::Allocator* inner) : inner_(inner) {
  c10::DeleterFnPtr expected = nullptr;
  if (inner->raw_deleter() != &release) foreign_deleter().compare_exchange_strong(expected, inner->raw_deleter());
}

c10::DataPtr counting_cpu_allocator::allocate_bytes(std::size_t bytes) const {
  c10::DataPtr inner = inner_->allocate(bytes);
  void* data = inner.get();
  if (data == nullptr || bytes == 0) return inner;
  {
    std::lock_guard lock(records_mutex());
    records()[data].push_back(record{std::move(inner), bytes, this});
  }
  const auto now = current_.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
  for (auto peak = peak_.load(); now > peak && !peak_.compare_exchange_weak(peak, now);) {
  }
  return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
}

std::unordered_map<void*, std::vector<counting_cpu_allocator::record>>& counting_cpu_allocator::records() {
  static auto* const map = new std::unordered_map<void*, std::vector<record>>;
  return *map;
}

std::mutex& counting_cpu_allocator::records_mutex() {
  static auto* const mutex = new std::mutex;
  return *mutex;
}

std::atomic<c10::DeleterFnPtr>& counting_cpu_allocator::foreign_deleter() {
  static std::atomic<c10::DeleterFnPtr> deleter{nullptr};
  return deleter;
}

void counting_cpu_allocator::release(void* data) {
  c10::DataPtr inner;  // frees the block through the inner allocator when it goes, outside the lock
  {
    std::lock_guard lock(records_mutex());
    const auto found = records().find(data);
    if (found != records().end()) {
      auto& outermost = found->second.back();
      outermost.owner->current_.fetch_sub(static_cast<std::int64_t>(outermost.bytes));
      inner = std::move(outermost.inner);  // an inner counting allocator's block: released next, by its record
      found->second.pop_back();
      if (found->second.empty()) records().erase(found);
      return;
    }
  }
  if (const auto deleter = foreign_deleter().load()) {
    deleter(data);
  } else {  // a block from an allocator without a raw deleter reached raw_deallocate: LibTorch forbids that
    std::cerr << "accel: a CPU block that no allocator can free reached the counting allocator; it is leaked"
              << std::endl;
  }
}

}  // namespace accel::detail
