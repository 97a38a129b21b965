/// \file
/// `background_save`: the thread that writes an asynchronous save's snapshot (at most one at a time), and what it
/// ended with: the directory it wrote, or its failure, kept until it is asked for, never lost.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <atomic>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include "../config.hpp"

namespace accel::detail {

class background_save {
 public:
  background_save() = default;
  background_save(const background_save&) = delete;
  background_save& operator=(const background_save&) = delete;
  /// Waits for the save; a failure nobody asked for is written to standard error.
  ACCEL_DECL ~background_save();

  /// Whether a save was started and not yet finished (`finish`).
  [[nodiscard]] bool pending() const noexcept { return thread_.joinable(); }
  /// Whether its thread is still writing (a pending save may be written already).
  [[nodiscard]] bool writing() const noexcept { return pending() && !done_.load(std::memory_order_acquire); }

  /// Runs `write` (the save of `directory`) in a thread; none may be pending.
  ACCEL_DECL void start(std::filesystem::path directory, std::function<void()> write);
  /// Waits for the pending save to end: the directory it wrote, or its failure rethrown (once); none when no save
  /// was pending.
  ACCEL_DECL std::optional<std::filesystem::path> finish();

 private:
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::exception_ptr failure_;
  std::filesystem::path directory_;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/background.ipp"
#endif
