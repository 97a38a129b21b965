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

#include "../config.hpp"
#include "../../options.hpp"

namespace accel::detail {

class checkpoint_schedule {
 public:
  ACCEL_DECL explicit checkpoint_schedule(const project_options& project);

  /// `range` (a prepared range's identity) yields a batch.
  ACCEL_DECL void batch_yielded(const void* range) noexcept;
  /// An optimizer stepped: a step, unless another optimizer stepped on the same batch already.
  ACCEL_DECL void optimizer_stepped() noexcept;
  /// `range` moves on from its batch; true when that batch's step makes a checkpoint due now (held instead while
  /// saves are held).
  [[nodiscard]] ACCEL_DECL bool batch_done(const void* range) noexcept;
  /// join_uneven_inputs begins: a save that comes due is held until it ends, since a process that ran out of data
  /// could not take part in it.
  void hold_saves() noexcept { holding_ = true; }
  /// The join ended: whether a save came due on this process meanwhile (then, agreed, every process saves once).
  [[nodiscard]] ACCEL_DECL bool release_saves() noexcept;
  /// True once, at the first pass, when the program resumes from the newest checkpoint.
  [[nodiscard]] bool resume_due() noexcept { return std::exchange(resume_pending_, false); }
  /// Optimizer steps over the whole run, a resumed one included.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

  // Saved in every process's file as a policy's state; absent from checkpoints written before it existed.
  void save_state(torch::serialize::OutputArchive& archive) const {
    archive.write("accel_optimizer_steps", c10::IValue(steps_));
  }
  ACCEL_DECL void load_state(torch::serialize::InputArchive& archive);

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

#if ACCEL_HEADER_ONLY
#include "impl/schedule.ipp"
#endif
