/// \file
/// Accumulation policies: how many micro-batches make one optimizer step.
///
/// Available policies / when to use:
/// - `accel::no_accumulation` (= `accel::accumulate<1>`): every batch steps. Costs nothing: no counter, no branch.
/// - `accel::accumulate<N>`: N micro-batches per step, known at compile time.
/// - `accel::accumulate_dynamic`: N read at run time, from `options::gradient_accumulation_steps` or the
///   environment variable `ACCELERATE_GRADIENT_ACCUMULATION_STEPS` (which wins, as in Accelerate), and settable
///   between windows: `acc.set_gradient_accumulation_steps(n)`.
///
/// Counting follows Accelerate's GradientState: entering `acc.accumulate(model)` starts a micro-step; it
/// synchronises when the count reaches a multiple of N, and on the last batch of a prepared range, where the count
/// restarts (windows never span passes). The loss is divided by N in `acc.backward`, also in a short last window.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "detail/config.hpp"
#include "concepts.hpp"
#include "detail/support/diagnostics.hpp"
#include "options.hpp"

namespace accel {
namespace detail {

/// Accelerate's micro-step count (`GradientState` and `Accelerator._do_sync`), for a run-time N.
class micro_step_counter {
 public:
  ACCEL_DECL void begin_micro_step(int steps, bool end_of_dataloader) noexcept;
  [[nodiscard]] int step() const noexcept { return static_cast<int>(step_); }
  [[nodiscard]] bool sync_gradients() const noexcept { return sync_; }
  /// A new N takes effect at a window's start: the count starts again, so that the next window has N micro-steps.
  void start_new_window() noexcept { *this = {}; }
  /// Checkpoints: resuming mid-window continues the window (a checkpoint without the count starts a new one).
  ACCEL_DECL void save_state(torch::serialize::OutputArchive& archive) const;
  ACCEL_DECL void load_state(torch::serialize::InputArchive& archive);

 private:
  std::int64_t step_ = 0;
  bool sync_ = true;  // before any micro-step, as Accelerate: an optimizer stepped outside accumulate() steps
};

/// ACCELERATE_GRADIENT_ACCUMULATION_STEPS, when set; a value that is not a whole number >= 1 is an error.
ACCEL_DECL std::optional<int> accumulation_steps_in_environment();

/// `options::gradient_accumulation_steps`, overridden by ACCELERATE_GRADIENT_ACCUMULATION_STEPS.
ACCEL_DECL int accumulation_steps_from(const options& opts);

/// `accumulate_dynamic::set_steps`'s checks: N at least 1, and no window open (its micro-batches' gradients are
/// accumulating, each divided by the old N).
ACCEL_DECL void check_new_steps(int steps, int current, const micro_step_counter& counter);

/// A compile-time N, the options and the environment must agree.
ACCEL_DECL void check_fixed_steps(const options& opts, int steps);

}  // namespace detail

/// The hooks an accumulation policy may leave out (concepts.hpp): a policy without a count has nothing to restart.
struct accumulation_defaults {
  [[nodiscard]] static constexpr std::string_view name() noexcept { return "a custom accumulation policy"; }
  /// Forgets the micro-step count (`free_memory`).
  static constexpr void restart() noexcept {}
};

/// `N` micro-batches per optimizer step, known at compile time.
template <int N>
struct accumulate : accumulation_defaults {
  static_assert(N >= 1, "accel::accumulate<N>: N counts micro-batches per optimizer step and must be at least 1");
  using policy_category = accumulation_tag;
  [[nodiscard]] static std::string name() { return "accumulate<" + std::to_string(N) + ">"; }

  explicit accumulate(const options& opts) { detail::check_fixed_steps(opts, N); }

  [[nodiscard]] static constexpr int steps() noexcept { return N; }
  void begin_micro_step(bool end_of_dataloader) noexcept { counter_.begin_micro_step(N, end_of_dataloader); }
  [[nodiscard]] int step() const noexcept { return counter_.step(); }
  [[nodiscard]] bool sync_gradients() const noexcept { return counter_.sync_gradients(); }
  /// The loss divided by N, so that N accumulated micro-batches give the gradient of their mean.
  [[nodiscard]] static at::Tensor scale_loss(const at::Tensor& loss) { return loss.div(N); }
  void restart() noexcept { counter_ = {}; }
  void save_state(torch::serialize::OutputArchive& archive) const { counter_.save_state(archive); }
  void load_state(torch::serialize::InputArchive& archive) { counter_.load_state(archive); }

 private:
  detail::micro_step_counter counter_;
};

/// One micro-batch per step: every hook is a constant, there is no state.
template <>
struct accumulate<1> : accumulation_defaults {
  using policy_category = accumulation_tag;
  [[nodiscard]] static std::string name() { return "accumulate<1>"; }

  explicit accumulate(const options& opts) { detail::check_fixed_steps(opts, 1); }

  [[nodiscard]] static constexpr int steps() noexcept { return 1; }
  static constexpr void begin_micro_step(bool) noexcept {}
  /// Accelerate counts micro-steps even without accumulation; nothing here needs the count, so it stays 0.
  [[nodiscard]] static constexpr int step() noexcept { return 0; }
  [[nodiscard]] static constexpr bool sync_gradients() noexcept { return true; }
  /// The loss as it is (no division, no copy).
  [[nodiscard]] static constexpr const at::Tensor& scale_loss(const at::Tensor& loss) noexcept { return loss; }
};

/// N micro-batches per step, N chosen at run time: `options::gradient_accumulation_steps`, or the environment
/// variable ACCELERATE_GRADIENT_ACCUMULATION_STEPS, which wins (as in Accelerate).
struct accumulate_dynamic : accumulation_defaults {
  using policy_category = accumulation_tag;
  [[nodiscard]] static constexpr std::string_view name() noexcept { return "accumulate_dynamic"; }

  explicit accumulate_dynamic(const options& opts) : steps_(detail::accumulation_steps_from(opts)) {}

  [[nodiscard]] int steps() const noexcept { return steps_; }
  void begin_micro_step(bool end_of_dataloader) noexcept { counter_.begin_micro_step(steps_, end_of_dataloader); }
  [[nodiscard]] int step() const noexcept { return counter_.step(); }
  [[nodiscard]] bool sync_gradients() const noexcept { return counter_.sync_gradients(); }
  [[nodiscard]] at::Tensor scale_loss(const at::Tensor& loss) const { return steps_ == 1 ? loss : loss.div(steps_); }
  /// A new N between windows (`acc.set_gradient_accumulation_steps`); refused in the middle of one, saying why. The
  /// micro-step count starts again, so that the next window has `steps` micro-steps.
  ACCEL_DECL void set_steps(int steps);
  void restart() noexcept { counter_ = {}; }
  void save_state(torch::serialize::OutputArchive& archive) const { counter_.save_state(archive); }
  void load_state(torch::serialize::InputArchive& archive) { counter_.load_state(archive); }

 private:
  int steps_;
  detail::micro_step_counter counter_;
};

namespace detail {
/// True for a policy whose every micro-step synchronises, known at compile time (`accumulate<1>`): the
/// accelerator then generates no accumulation code at all.
template <class A>
concept always_syncs = requires {
  requires std::integral_constant<int, A::steps()>::value == 1;
  requires std::integral_constant<bool, A::sync_gradients()>::value;
};
/// True for a policy whose N can change at run time (`accumulate_dynamic`): it has `set_steps(n)`, an optional hook.
template <class A>
concept steps_settable = requires(A& policy) { policy.set_steps(1); };
}  // namespace detail

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/accumulation.ipp"
#endif
