/// \file
/// `accelerator_access`: the one door through which the prepared adapters reach their accelerator's internals
/// (the accelerator befriends it alone), so that neither side repeats the other's constraints.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <cstdint>
#include <utility>

#include "../../options.hpp"
#include "registry.hpp"

namespace accel::detail {

struct accelerator_access {
  template <class Accelerator>
  [[nodiscard]] static registration register_optimizer(Accelerator& acc, torch::optim::Optimizer& optimizer) {
    return acc.registry_.add_optimizer(optimizer);
  }
  template <class Accelerator>
  [[nodiscard]] static registration register_state(Accelerator& acc, checkpoint_slot slot) {
    return acc.registry_.add_slot(std::move(slot));
  }
  template <class Accelerator>
  [[nodiscard]] static registration register_range(Accelerator& acc, even_batches_switch range) {
    return acc.registry_.add_range(std::move(range));
  }
  /// `prepared_optimizer::step()`.
  template <class Accelerator>
  static void step_optimizer(Accelerator& acc, torch::optim::Optimizer& optimizer) {
    acc.step_optimizer(optimizer);
  }
  /// `prepared_optimizer::zero_grad()`, on steps that synchronise.
  template <class Accelerator>
  static void zero_grad(Accelerator& acc, torch::optim::Optimizer& optimizer, bool set_to_none) {
    acc.zero_grad(optimizer, set_to_none);
  }
  /// `prepared_range`, before it yields each batch: whether it is the last of its pass, and the real samples of
  /// the last global batch (-1: nothing padded).
  template <class Accelerator>
  static void set_end_of_dataloader(Accelerator& acc, bool last, std::int64_t remainder) noexcept {
    acc.gradient_state_.end_of_dataloader = last;
    acc.gradient_state_.remainder = remainder;
  }
  /// `prepared_range`, when a pass starts (resuming from the newest checkpoint), when it yields a batch and when it
  /// moves on from one (an automatic checkpoint); `range` identifies it. What resuming and saving do the schedule
  /// calls as `checkpoint_automatically` bound them, so a loop alone instantiates neither.
  template <class Accelerator>
  static void before_pass(Accelerator& acc) {
    acc.schedule_.pass_starts();
  }
  template <class Accelerator>
  static void batch_yielded(Accelerator& acc, const void* range) noexcept {
    acc.schedule_.batch_yielded(range);
  }
  template <class Accelerator>
  static void after_batch(Accelerator& acc, const void* range) {
    acc.schedule_.batch_done(range);
  }
  /// `checkpoint_automatically`.
  template <class Accelerator>
  static void plan_checkpoints(Accelerator& acc, const automatic_checkpoint_options& how) {
    acc.schedule_.plan(how, acc.options_.project,
                       {.resume_from_newest = [&acc] { acc.resume_from_newest(); },
                        .save = [&acc, save = how.save] { (void)acc.save_state(save); }});
  }
  /// `prepared_model`, before each forward (data parallel: arm the gradient hooks, sync buffers).
  template <class Accelerator>
  static void before_forward(Accelerator& acc, const torch::nn::Module& module) {
    acc.before_forward(module);
  }
  /// `prepared_model`, around each forward: the parallel policy's scope (tensor parallelism routes its split layers).
  template <class Accelerator>
  [[nodiscard]] static auto parallel_forward_scope(const Accelerator& acc) {
    return acc.parallel_.forward_scope();
  }
  /// `accel::parallelize_module`: the policy that splits the model.
  template <class Accelerator>
  [[nodiscard]] static auto& parallel(Accelerator& acc) noexcept {
    return acc.parallel_;
  }
  /// `prepare`, for a range of batches: which part of the data this process reads.
  template <class Accelerator>
  [[nodiscard]] static auto shard_options_here(const Accelerator& acc) {
    return acc.shard_options_here();
  }
  /// `accel::wait_for_checkpoint`: the asynchronous save in flight, waited for.
  template <class Accelerator>
  static auto finish_background_save(Accelerator& acc) {
    return acc.state_.finish_background_save();
  }
  /// `prepared_model`, on the forward's result (bf16/fp16: float32 outputs).
  template <class Accelerator, class Output>
  static decltype(auto) forward_output(const Accelerator& acc, Output&& output) {
    return acc.precision_.forward_output(std::forward<Output>(output));
  }
};

}  // namespace accel::detail
