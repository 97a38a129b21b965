/// \file
/// `checkpoint_schedule`: when the accelerator checkpoints and resumes by itself (`accel::checkpoint_automatically`).
/// It counts the optimizer steps (the batches on which one or more optimizers stepped), a count the checkpoint holds
/// so that a resumed run saves at the same steps as an uninterrupted one. A step belongs to the prepared range that
/// yielded its batch, and the checkpoint it makes due is saved when that range moves on: an evaluation loop run
/// inside the training loop neither counts nor saves. What saving and resuming do it calls through
/// `automatic_checkpoint_actions`, which only a program that asks for them instantiates.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "../config.hpp"
#include "../../options.hpp"

namespace accel::detail {

/// What the automatic checkpoints do, bound to an accelerator by `checkpoint_automatically`.
struct automatic_checkpoint_actions {
  std::function<void()> resume_from_newest;
  std::function<void()> save;
};

class checkpoint_schedule {
 public:
  /// From now on, save and resume as `how` says, by `actions`. Throws std::invalid_argument for a negative step
  /// count or without the numbered checkpoints of `project.automatic_checkpoint_naming`, std::logic_error for
  /// `resume::latest` once a batch was yielded.
  ACCEL_DECL void plan(const automatic_checkpoint_options& how, const project_options& project,
                       automatic_checkpoint_actions actions);

  /// A prepared range starts a pass: the newest checkpoint loads first when the plan resumes and this is the
  /// first pass.
  ACCEL_DECL void pass_starts();
  /// `range` (a prepared range's identity) yields a batch.
  ACCEL_DECL void batch_yielded(const void* range) noexcept;
  /// An optimizer stepped: a step, unless another optimizer stepped on the same batch already.
  ACCEL_DECL void optimizer_stepped() noexcept;
  /// `range` moves on from its batch: saves when that batch's step makes a checkpoint due (holds it instead while
  /// saves are held).
  ACCEL_DECL void batch_done(const void* range);
  /// join_uneven_inputs begins: a save that comes due is held until it ends, since a process that ran out of data
  /// could not take part in it.
  void hold_saves() noexcept { holding_ = true; }
  /// The join ended: whether a save came due on this process meanwhile (then, agreed, every process saves once,
  /// by `save_now`).
  [[nodiscard]] ACCEL_DECL bool release_saves() noexcept;
  void save_now() { actions_.save(); }
  /// Optimizer steps over the whole run, a resumed one included.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

  // Saved in every process's file as a policy's state; absent from checkpoints written before it existed.
  void save_state(torch::serialize::OutputArchive& archive) const {
    archive.write("accel_optimizer_steps", c10::IValue(steps_));
  }
  ACCEL_DECL void load_state(torch::serialize::InputArchive& archive);

 private:
  std::int64_t every_ = 0;
  bool resume_pending_ = false;
  automatic_checkpoint_actions actions_;
  const void* yielding_ = nullptr;       // the range that yielded the last batch
  std::uint64_t batch_ = 0;              // batches yielded, by any range
  std::uint64_t stepped_batch_ = 0;      // the batch of the last step
  const void* stepped_range_ = nullptr;  // the range whose batch stepped, until it moves on
  std::int64_t steps_ = 0;
  bool holding_ = false;  // during join_uneven_inputs
  bool held_ = false;     // a save came due while holding
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/schedule.ipp"
#endif
