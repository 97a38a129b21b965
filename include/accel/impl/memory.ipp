/// \file
/// What memory.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../memory.hpp"

namespace accel::detail {

std::atomic<counting_cpu_allocator*>& installed_cpu_counter() noexcept {
  static std::atomic<counting_cpu_allocator*> installed{nullptr};
  return installed;
}
}  // namespace accel::detail

namespace accel {

void count_cpu_memory() {
  static detail::counting_cpu_allocator* const counter = [] {
    auto* created = new detail::counting_cpu_allocator(c10::GetCPUAllocator());  // never destroyed: see its header
    c10::SetAllocator(c10::DeviceType::CPU, created, /*priority=*/100);
    return created;
  }();
  if (c10::GetCPUAllocator() != counter)
    throw std::logic_error(
        "accel::count_cpu_memory: another CPU allocator is installed with a higher priority (c10::SetAllocator), "
        "so CPU storage cannot be counted; count with that allocator, or do not install it");
  detail::installed_cpu_counter().store(counter);
}

memory_statistics memory_stats(const c10::Device& device) {
  if (device.is_cpu()) {
    const auto* counter = detail::installed_cpu_counter().load();
    if (counter == nullptr)
      throw std::logic_error(
          "accel::memory_stats(cpu): CPU storage is counted only from accel::count_cpu_memory() on; call it at the "
          "start of the program (before what you measure is allocated)");
    const auto allocated = counter->current(), peak = counter->peak();
    return {.allocated = allocated, .peak_allocated = peak, .reserved = allocated, .peak_reserved = peak};
  }
  const auto counters = detail::compat::device_memory(device);
  if (!counters)
    throw std::invalid_argument(
        "accel::memory_stats: no memory statistics for " + device.str() +
        ": this LibTorch has no caching allocator for it that accel can read (CUDA from "
        "LibTorch 2.9, or with the accel::nccl target before); the CPU: accel::count_cpu_memory()");
  return {.allocated = counters->allocated,
          .peak_allocated = counters->peak_allocated,
          .reserved = counters->reserved,
          .peak_reserved = counters->peak_reserved};
}

void reset_peak_memory_stats(const c10::Device& device) {
  if (device.is_cpu()) {
    (void)memory_stats(device);  // its error before counting is on
    detail::installed_cpu_counter().load()->reset_peak();
  } else if (!detail::compat::reset_device_memory_peaks(device)) {
    (void)memory_stats(device);  // throws, naming the device
  }
}
}  // namespace accel

namespace accel::detail {

bool mentions_out_of_memory(std::string_view message) {
  return std::ranges::any_of(out_of_memory_messages,
                             [&](std::string_view known) { return message.find(known) != std::string_view::npos; });
}
}  // namespace accel::detail

namespace accel {

bool should_reduce_batch_size(const std::exception_ptr& error) noexcept {
  if (!error) return false;
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc&) {
    return true;
  } catch (const c10::OutOfMemoryError&) {
    return true;
  } catch (const c10::Error& e) {
    return detail::mentions_out_of_memory(e.what_without_backtrace());
  } catch (...) {
    return false;
  }
}
}  // namespace accel

namespace accel::detail {

std::string error_summary(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return first_line(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return first_line(e.what());
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

void throw_no_batch_size_left(int starting_batch_size, const out_of_memory_record& last) {
  const std::string where = "batch size " + std::to_string(last.batch_size);
  const std::string message =
      "accel::find_executable_batch_size: no executable batch size found, reached zero: every batch size tried, from " +
      std::to_string(starting_batch_size) + " down to " + std::to_string(last.batch_size) +
      ", ran out of memory; the last: " +
      (last.error ? "at " + where + ", " + error_summary(last.error) + " (nested in this error)"
                  : "process " + std::to_string(last.process) + " at " + where + " (that process reports it)") +
      ". If that is not what the batch size sizes (an evaluation batch of fixed size, say), fix it there; otherwise "
      "free what the program still holds before the search (tensors, models and optimizers no longer needed; "
      "acc.free_memory()), or make a sample fit: a smaller model or sequence, mixed precision (bf16, fp16), gradient "
      "checkpointing, or a device with more memory";
  if (!last.error) throw batch_size_error(message);
  try {
    std::rethrow_exception(last.error);
  } catch (...) {
    std::throw_with_nested(batch_size_error(message));
  }
}

}  // namespace accel::detail
