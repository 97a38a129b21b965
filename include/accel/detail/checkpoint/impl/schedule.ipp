/// \file
/// What schedule.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../schedule.hpp"

namespace accel::detail {

void checkpoint_schedule::plan(const automatic_checkpoint_options& how, const project_options& project,
                               automatic_checkpoint_actions actions) {
  const bool resumes = how.resume == resume::latest;
  if (how.every_steps < 0)
    throw std::invalid_argument("accel::checkpoint_automatically: every_steps = " + std::to_string(how.every_steps) +
                                " must be 0 (no automatic saves) or a number of optimizer steps");
  if ((how.every_steps > 0 || resumes) && !project.automatic_checkpoint_naming)
    throw std::invalid_argument(std::string("accel::checkpoint_automatically: ") +
                                (how.every_steps > 0 ? "every_steps" : "resume = resume::latest") +
                                " works with the numbered checkpoints of options::project.automatic_checkpoint_naming;"
                                " set it to true");
  if (resumes && batch_ > 0)
    throw std::logic_error(
        "accel::checkpoint_automatically: resume = resume::latest after the first batch would load a checkpoint "
        "in the middle of the run; call it before the training loop");
  every_ = how.every_steps;
  resume_pending_ = resumes;
  actions_ = std::move(actions);
}

void checkpoint_schedule::pass_starts() {
  if (std::exchange(resume_pending_, false)) actions_.resume_from_newest();
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

void checkpoint_schedule::batch_done(const void* range) {
  if (range == nullptr || stepped_range_ != range) return;
  stepped_range_ = nullptr;
  const bool due = every_ > 0 && steps_ % every_ == 0;
  held_ = held_ || (due && holding_);
  if (due && !holding_) actions_.save();
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
