/// \file
/// What schedule.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../schedule.hpp"

namespace accel::detail {

checkpoint_schedule::checkpoint_schedule(const project_options& project)
    : every_(project.save_every_steps), resume_pending_(project.resume == resume::latest) {
  if (every_ < 0)
    throw std::invalid_argument("accel::options: project.save_every_steps = " + std::to_string(every_) +
                                " must be 0 (no automatic saves) or a number of optimizer steps");
  if ((every_ > 0 || resume_pending_) && !project.automatic_checkpoint_naming)
    throw std::invalid_argument(
        std::string("accel::options: project.") + (every_ > 0 ? "save_every_steps" : "resume = resume::latest") +
        " works with the numbered checkpoints of project.automatic_checkpoint_naming; set it to true");
}

void checkpoint_schedule::batch_yielded(const void* range) noexcept {
  yielding_ = range;
  ++batch_;
}

void checkpoint_schedule::optimizer_stepped() noexcept {
  if (yielding_ != nullptr && stepped_batch_ == batch_) return;
  stepped_batch_ = batch_;
  stepped_range_ = yielding_;
  ++steps_;
}

bool checkpoint_schedule::batch_done(const void* range) noexcept {
  if (range == nullptr || stepped_range_ != range) return false;
  stepped_range_ = nullptr;
  const bool due = every_ > 0 && steps_ % every_ == 0;
  held_ = held_ || (due && holding_);
  return due && !holding_;
}

bool checkpoint_schedule::release_saves() noexcept {
  holding_ = false;
  return std::exchange(held_, false);
}

void checkpoint_schedule::load_state(torch::serialize::InputArchive& archive) {
  c10::IValue steps;
  steps_ = archive.try_read("accel_optimizer_steps", steps) ? steps.toInt() : 0;
  stepped_range_ = nullptr;
}

}  // namespace accel::detail
