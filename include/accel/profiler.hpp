/// \file
/// `acc.profile(options)`: LibTorch's profiler (Kineto) over part of a training loop, as Accelerate's `profile` with
/// `ProfileKwargs`: `accel::profile_options` (activities, a `torch.profiler.schedule`, an on-trace-ready callback,
/// shapes, memory, stacks, FLOPs, modules, `output_trace_dir`), `accel::profile_schedule` and its actions, and
/// `accel::profiler`, the scope `acc.profile()` returns: `step()` moves it along the schedule, and its end (or
/// `finish()`) writes `profile_{process_index}.json` in Chrome trace format on every process. Its events and their
/// `key_averages()` table are in profile_events.hpp.
#pragma once

#include <ATen/record_function.h>
#include <c10/core/DeviceType.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "detail/config.hpp"
#include "detail/support/atomic_file.hpp"
#include "detail/compat.hpp"
#include "detail/support/json.hpp"
#include "detail/support/scope.hpp"
#include "detail/support/text.hpp"
#include "profile_events.hpp"

namespace accel {

/// A profile that cannot be written (`output_trace_dir` unusable, nothing recorded) or read.
class profile_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What the profiler records (Accelerate's `ProfileKwargs.activities`: "cpu", "cuda").
enum class profiler_activity { cpu, cuda };

/// What the profiler does during a step (`torch.profiler.ProfilerAction`): nothing, warm up (prepared, not
/// recording), record, or record and, at the end of the step, hand the window to `on_trace_ready`.
enum class profiler_action { none, warmup, record, record_and_save };

/// The action's name: "none", "warmup", "record" or "record_and_save".
ACCEL_DECL std::ostream& operator<<(std::ostream& out, profiler_action action);

/// `torch.profiler.schedule`'s arguments (Accelerate's `ProfileKwargs.schedule_option`): skip the first `skip_first`
/// steps, then cycles of `wait` steps doing nothing, `warmup` steps warming up and `active` steps recording; `repeat`
/// cycles (0: until the profile ends).
struct profile_schedule {
  int wait = 0;
  int warmup = 0;
  int active = 1;
  int repeat = 0;
  int skip_first = 0;
};

/// The action of `schedule` at step `step` (counted from 0), as `torch.profiler.schedule` computes it.
[[nodiscard]] ACCEL_DECL profiler_action scheduled_action(const profile_schedule& schedule, std::int64_t step);

class profiler;

/// Accelerate's `ProfileKwargs`: what `acc.profile()` records and where it goes.
struct profile_options {
  /// What to record; empty: the CPU, and CUDA when LibTorch sees a CUDA device (torch.profiler's default).
  std::vector<profiler_activity> activities = {};
  /// Without one, everything is recorded from the start to the end of the scope, as one window.
  std::optional<profile_schedule> schedule = std::nullopt;
  /// Called with the profiler at the end of each recorded window (`events()`, `chrome_trace()` and
  /// `export_chrome_trace()` then hold that window).
  std::function<void(profiler&)> on_trace_ready = nullptr;
  /// The operators' input shapes and dtypes ("Input Dims", "Input type" in the trace; `profile_event::input_shapes`).
  bool record_shapes = false;
  /// Allocations and frees ("[memory]" events).
  bool profile_memory = false;
  /// Source locations of the operators (TorchScript's; a C++ program has no Python stack to record).
  bool with_stack = false;
  /// FLOPs of matrix multiplications and convolutions (`profile_event::flops`); records shapes too, as PyTorch does.
  bool with_flops = false;
  /// The module hierarchy of the operators (TorchScript modules').
  bool with_modules = false;
  /// Where each process writes `profile_{process_index}.json` (created if needed) when the profile ends; none: no file.
  std::optional<std::filesystem::path> output_trace_dir = std::nullopt;
};

namespace detail {

/// LibTorch profiles one scope at a time per process: set while an `accel::profiler` is alive.
inline std::atomic<bool> profiler_alive{false};

ACCEL_DECL std::logic_error profiler_running();

ACCEL_DECL void check_schedule(const profile_schedule& s);

/// The activities LibTorch records: the ones asked for, or the CPU and CUDA when present.
ACCEL_DECL std::set<torch::profiler::impl::ActivityType> profiler_activities(
    const std::vector<profiler_activity>& asked);

ACCEL_DECL torch::profiler::impl::ProfilerConfig profiler_config(const profile_options& o);

ACCEL_DECL profile_event event_of(const torch::autograd::profiler::KinetoEvent& e);

/// `nanoseconds` as microseconds with three decimals, the Chrome trace's time unit.
ACCEL_DECL std::string trace_microseconds(std::int64_t nanoseconds);

/// The Chrome trace of `events`, written by accel where LibTorch cannot write one (no Kineto: Debian's 1.13). The
/// fields Kineto writes for the same events: complete events ("X") for operators and marks, instant events ("i")
/// for memory, input shapes and types as "Input Dims" and "Input type".
ACCEL_DECL std::string chrome_trace_of(const std::vector<profile_event>& events);

/// The Chrome trace LibTorch's profiler (Kineto) writes for `result`. Kineto writes only to a file, only once per
/// result, and says nothing when it cannot: it writes to a temporary file here, read back and removed.
ACCEL_DECL std::string kineto_trace(torch::autograd::profiler::ProfilerResult& result);

}  // namespace detail

/// LibTorch's profiler running over a scope: what `acc.profile(options)` returns (Accelerate's `profile` context
/// manager). Keep it alive for as long as the profile should last: `auto prof = acc.profile({...});`, and call
/// `prof.step()` at the end of each training step when there is a schedule. One per process at a time, used from the
/// thread that created it.
///
/// Its end, `finish()`: the open window (if any) is closed and handed to `on_trace_ready`; with `output_trace_dir`,
/// this process writes `profile_{process_index}.json` there, then every process waits for the others (a collective
/// then, as in Accelerate). `finish()` throws what went wrong (`profile_error` naming the file for a directory
/// that cannot be written, or the callback's exception), once every process is past the wait. The destructor
/// finishes a profiler that was not finished; as it must not throw, it prints such an error on std::cerr instead: call
/// `finish()` to handle it. When an exception leaves the scope, the destructor only stops LibTorch's profiler: no
/// callback, no file, no wait (a process unwinding must not wait for the others). Either way, LibTorch's profiler is
/// off once the profiler is finished or destroyed.
class profiler {
 public:
  /// Starts profiling (step 0). Called by `accelerator::profile`; `wait_for_everyone` is the job's barrier.
  ACCEL_DECL profiler(profile_options options, int process_index, std::function<void()> wait_for_everyone);
  profiler(const profiler&) = delete;
  profiler& operator=(const profiler&) = delete;
  ACCEL_DECL ~profiler();

  /// Ends the current step and starts the next: the profiler moves along its schedule (torch.profiler's `step`).
  ACCEL_DECL void step();

  /// Ends the profile (see the class): the callback for the open window; with `output_trace_dir`,
  /// `profile_{process_index}.json` and the wait for every process; then throws what failed, if anything. Does nothing
  /// the second time.
  ACCEL_DECL void finish();

  /// Steps taken (`step()` calls): torch.profiler's `step_num`.
  [[nodiscard]] std::int64_t step_num() const noexcept { return step_num_; }
  /// What the profiler does during the current step.
  [[nodiscard]] profiler_action action() const noexcept { return action_; }
  /// Whether a window has been recorded (what the accessors below read).
  [[nodiscard]] bool has_trace() const noexcept { return result_ != nullptr; }

  /// The events of the last recorded window (none before the first window ends).
  [[nodiscard]] ACCEL_DECL const std::vector<profile_event>& events() const;
  /// The events of the last recorded window aggregated per name (torch.profiler's `key_averages()`; per name and
  /// input shapes with `group_by_input_shape`, which needs `record_shapes`): `.table(sort_by, row_limit)` prints them.
  [[nodiscard]] profile_averages key_averages(bool group_by_input_shape = false) const {
    return accel::key_averages(events(), group_by_input_shape);
  }
  /// The last recorded window in Chrome trace format (JSON; chrome://tracing, Perfetto, TensorBoard's profiler):
  /// LibTorch's own trace, or, for a LibTorch without Kineto (Debian's 1.13), accel's of the same events.
  [[nodiscard]] ACCEL_DECL const std::string& chrome_trace() const;
  /// Writes `chrome_trace()` to `path`, atomically.
  ACCEL_DECL void export_chrome_trace(const std::filesystem::path& path) const;

 private:
  [[nodiscard]] ACCEL_DECL profiler_action action_at(std::int64_t step) const;

  /// torch.profiler.profile's transitions (its `action_map`) from one step's action to the next's (none: the end).
  ACCEL_DECL void transit(profiler_action from, std::optional<profiler_action> to);

  ACCEL_DECL void prepare();
  ACCEL_DECL void start();
  /// Ends the recording window, if one is open (a callback that threw may have left none); returns whether one was.
  ACCEL_DECL bool stop();
  /// Closes a session prepared (warming up) but never recorded, as torch.profiler does: started and stopped. What
  /// it holds is discarded: the last recorded window stays the one to write.
  ACCEL_DECL void close_prepared();
  /// Hands the window to `on_trace_ready`. What the callback throws waits until the transition is complete, so that
  /// the profiler follows its schedule still (the next window recorded), then leaves `step()` or `finish()`.
  ACCEL_DECL void trace_ready();
  ACCEL_DECL void rethrow_callback_failure();

  /// The `ProfilerStep#N` mark around each step, with a schedule (as torch.profiler does).
  ACCEL_DECL void mark_step();

  /// Stops LibTorch's profiler whatever state it is in, without a callback, and gives up this process's profiler.
  ACCEL_DECL void abandon() noexcept;

  [[nodiscard]] ACCEL_DECL std::string nothing_recorded() const;

  ACCEL_DECL void write_trace(const std::filesystem::path& directory) const;

  profile_options options_;
  int process_index_;
  std::function<void()> wait_for_everyone_;
  torch::profiler::impl::ProfilerConfig config_;
  std::set<torch::profiler::impl::ActivityType> activities_;
  profiler_action action_ = profiler_action::none;
  std::int64_t step_num_ = 0;
  std::optional<at::RecordFunction> step_mark_;
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result_;
  mutable std::optional<std::vector<profile_event>> events_;
  mutable std::optional<std::string> trace_;
  std::exception_ptr callback_failure_;
  bool prepared_ = false;
  bool enabled_ = false;
  bool finished_ = false;
  bool owns_flag_ = true;
  int uncaught_ = std::uncaught_exceptions();
};

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/profiler.ipp"
#endif
