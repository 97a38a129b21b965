/// \file
/// What background.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../background.hpp"

#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>

namespace accel::detail {

background_save::~background_save() {
  try {
    (void)finish();
  } catch (const std::exception& e) {
    std::cerr << "accel: an asynchronous save_state failed, and nothing waited for it (wait_for_checkpoint, "
                 "wait_for_everyone or end_training report it): "
              << e.what() << "\n";
  } catch (...) {
    std::cerr << "accel: an asynchronous save_state failed with an exception that is not a std::exception\n";
  }
}

void background_save::start(std::filesystem::path directory, std::function<void()> write) {
  if (pending()) throw std::logic_error("accel: a background save is pending; finish it first");
  directory_ = std::move(directory);
  failure_ = nullptr;
  done_.store(false, std::memory_order_release);
  thread_ = std::thread([this, write = std::move(write)] {
    try {
      write();
    } catch (...) {
      failure_ = std::current_exception();
    }
    done_.store(true, std::memory_order_release);
  });
}

std::optional<std::filesystem::path> background_save::finish() {
  if (!pending()) return std::nullopt;
  thread_.join();
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  return directory_;
}

}  // namespace accel::detail
