/// \file
/// `checkpoint_schedule`: when the accelerator checkpoints and resumes by itself (`options::project`'s
/// `save_every_steps` and `resume`). It counts the optimizer steps (the batches on which one or more optimizers
/// stepped), a count the checkpoint holds so that a resumed run saves at the same steps as an uninterrupted one. A
/// step belongs to the prepared range that yielded its batch, and the checkpoint it makes due is saved when that
/// range moves on: an evaluation loop run inside the training loop neither counts nor saves.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "../../options.hpp"

namespace accel::detail {

class checkpoint_schedule {
 public:
  explicit checkpoint_schedule(const project_options& project)
      : every_(project.save_every_steps), resume_pending_(project.resume == resume::latest) {
    if (every_ < 0)
      throw std::invalid_argument("accel::options: project.save_every_steps = " + std::to_string(every_) +
                                  " must be 0 (no automatic saves) or a number of optimizer steps");
    if ((every_ > 0 || resume_pending_) && !project.automatic_checkpoint_naming)
      throw std::invalid_argument(
          std::string("accel::options: project.") + (every_ > 0 ? "save_every_steps" : "resume = resume::latest") +
          " works with the numbered checkpoints of project.automatic_checkpoint_naming; set it to true");
  }

  /// `range` (a prepared range's identity) yields a batch.
  void batch_yielded(const void* range) noexcept {
    yielding_ = range;
    ++batch_;
  }
  /// An optimizer stepped: a step, unless another optimizer stepped on the same batch already.
  void optimizer_stepped() noexcept {
    if (yielding_ != nullptr && stepped_batch_ == batch_) return;
    stepped_batch_ = batch_;
    stepped_range_ = yielding_;
    ++steps_;
  }
  /// `range` moves on from its batch; true when that batch's step makes a checkpoint due now (held instead while
  /// saves are held).
  [[nodiscard]] bool batch_done(const void* range) noexcept {
    if (range == nullptr || stepped_range_ != range) return false;
    stepped_range_ = nullptr;
    const bool due = every_ > 0 && steps_ % every_ == 0;
    held_ = held_ || (due && holding_);
    return due && !holding_;
  }
  /// join_uneven_inputs begins: a save that comes due is held until it ends, since a process that ran out of data
  /// could not take part in it.
  void hold_saves() noexcept { holding_ = true; }
  /// The join ended: whether a save came due on this process meanwhile (then, agreed, every process saves once).
  [[nodiscard]] bool release_saves() noexcept {
    holding_ = false;
    return std::exchange(held_, false);
  }
  /// True once, at the first pass, when the program resumes from the newest checkpoint.
  [[nodiscard]] bool resume_due() noexcept { return std::exchange(resume_pending_, false); }
  /// Optimizer steps over the whole run, a resumed one included.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

  // Saved in every process's file as a policy's state; absent from checkpoints written before it existed.
  void save_state(torch::serialize::OutputArchive& archive) const {
    archive.write("accel_optimizer_steps", c10::IValue(steps_));
  }
  void load_state(torch::serialize::InputArchive& archive) {
    c10::IValue steps;
    steps_ = archive.try_read("accel_optimizer_steps", steps) ? steps.toInt() : 0;
    stepped_range_ = nullptr;
  }

 private:
  std::int64_t every_;
  bool resume_pending_;
  const void* yielding_ = nullptr;       // the range that yielded the last batch
  std::uint64_t batch_ = 0;              // batches yielded, by any range
  std::uint64_t stepped_batch_ = 0;      // the batch of the last step
  const void* stepped_range_ = nullptr;  // the range whose batch stepped, until it moves on
  std::int64_t steps_ = 0;
  bool holding_ = false;  // during join_uneven_inputs
  bool held_ = false;     // a save came due while holding
};

}  // namespace accel::detail
