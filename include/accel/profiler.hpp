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
inline std::ostream& operator<<(std::ostream& out, profiler_action action) {
  constexpr const char* names[] = {"none", "warmup", "record", "record_and_save"};
  return out << names[static_cast<int>(action)];
}

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
[[nodiscard]] inline profiler_action scheduled_action(const profile_schedule& schedule, std::int64_t step) {
  if (step < schedule.skip_first) return profiler_action::none;
  step -= schedule.skip_first;
  const std::int64_t cycle = schedule.wait + schedule.warmup + schedule.active;
  if (schedule.repeat > 0 && step / cycle >= schedule.repeat) return profiler_action::none;
  const auto within = step % cycle;
  if (within < schedule.wait) return profiler_action::none;
  if (within < schedule.wait + schedule.warmup) return profiler_action::warmup;
  return within < cycle - 1 ? profiler_action::record : profiler_action::record_and_save;
}

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

inline std::logic_error profiler_running() {
  return std::logic_error(
      "accel::accelerator::profile: a profiler is already running in this process (another profile() scope, or "
      "LibTorch's own profiler); LibTorch profiles one scope at a time: finish the other one first");
}

inline void check_schedule(const profile_schedule& s) {
  if (s.wait < 0 || s.warmup < 0 || s.active <= 0 || s.repeat < 0 || s.skip_first < 0)
    throw std::invalid_argument("accel::profile_schedule: wait = " + std::to_string(s.wait) +
                                " (need >= 0), warmup = " + std::to_string(s.warmup) + " (need >= 0), active = " +
                                std::to_string(s.active) + " (need > 0), repeat = " + std::to_string(s.repeat) +
                                " (need >= 0), skip_first = " + std::to_string(s.skip_first) + " (need >= 0)");
}

/// The activities LibTorch records: the ones asked for, or the CPU and CUDA when present.
inline std::set<torch::profiler::impl::ActivityType> profiler_activities(const std::vector<profiler_activity>& asked) {
  using torch::profiler::impl::ActivityType;
  const bool cuda = torch::cuda::is_available();
  if (asked.empty()) return cuda ? std::set{ActivityType::CPU, ActivityType::CUDA} : std::set{ActivityType::CPU};
  std::set<ActivityType> activities;
  for (const auto activity : asked) {
    if (activity == profiler_activity::cuda && !cuda)
      throw std::invalid_argument(
          "accel::profile_options::activities asks for cuda, but LibTorch sees no CUDA device here; leave "
          "activities empty to record what is available");
    activities.insert(activity == profiler_activity::cuda ? ActivityType::CUDA : ActivityType::CPU);
  }
  return activities;
}

inline torch::profiler::impl::ProfilerConfig profiler_config(const profile_options& o) {
  return torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO,
                                               o.record_shapes || o.with_flops, o.profile_memory, o.with_stack,
                                               o.with_flops, o.with_modules);
}

inline profile_event event_of(const torch::autograd::profiler::KinetoEvent& e) {
  profile_event event{.name = e.name(),
                      .start_ns = compat::profiler_event_start_ns(e),
                      .duration_ns = compat::profiler_event_duration_ns(e),
                      .thread = e.startThreadId(),
                      .flops = e.flops(),
                      .bytes = e.nBytes(),
                      .sequence_nr = e.sequenceNr()};
  if (event.name == "[memory]")
    event.category = "cpu_instant_event";
  else if (e.scope() == static_cast<std::uint8_t>(at::RecordScope::USER_SCOPE))
    event.category = "user_annotation";
  else
    event.category = e.deviceType() == c10::DeviceType::CPU ? "cpu_op" : "kernel";
  if (e.hasShapes()) event.input_shapes.assign(e.shapes().begin(), e.shapes().end());
  if (e.hasTypes()) event.input_types.assign(e.dtypes().begin(), e.dtypes().end());
  return event;
}

/// `nanoseconds` as microseconds with three decimals, the Chrome trace's time unit.
inline std::string trace_microseconds(std::int64_t nanoseconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%lld.%03lld", static_cast<long long>(nanoseconds / 1000),
                static_cast<long long>(nanoseconds % 1000));
  return text;
}

/// The Chrome trace of `events`, written by accel where LibTorch cannot write one (no Kineto: Debian's 1.13). The
/// fields Kineto writes for the same events: complete events ("X") for operators and marks, instant events ("i")
/// for memory, input shapes and types as "Input Dims" and "Input type".
inline std::string chrome_trace_of(const std::vector<profile_event>& events) {
  const auto pid = std::to_string(::getpid());
  std::string trace = "{\n  \"schemaVersion\": 1,\n  \"displayTimeUnit\": \"ms\",\n  \"traceEvents\": [";
  const char* separator = "\n";
  for (const auto& e : events) {
    const bool instant = e.category == "cpu_instant_event";
    trace += separator;
    separator = ",\n";
    trace += "  {\"ph\": \"" + std::string(instant ? "i\", \"s\": \"t" : "X") +
             "\", \"cat\": " + json_string(e.category) + ", \"name\": " + json_string(e.name) + ", \"pid\": " + pid +
             ", \"tid\": " + std::to_string(e.thread) + ", \"ts\": " + trace_microseconds(e.start_ns);
    if (!instant) trace += ", \"dur\": " + trace_microseconds(e.duration_ns);
    std::string args;
    if (instant) append_item(args, "\"Bytes\": " + std::to_string(e.bytes));
    if (e.sequence_nr >= 0) append_item(args, "\"Sequence number\": " + std::to_string(e.sequence_nr));
    if (!e.input_shapes.empty()) {
      std::string shapes;
      for (const auto& shape : e.input_shapes) {
        std::string sizes;
        for (const auto size : shape) append_item(sizes, std::to_string(size));
        append_item(shapes, "[" + sizes + "]");
      }
      append_item(args, "\"Input Dims\": [" + shapes + "]");
    }
    if (!e.input_types.empty()) {
      std::string types;
      for (const auto& type : e.input_types) append_item(types, json_string(type));
      append_item(args, "\"Input type\": [" + types + "]");
    }
    trace += ", \"args\": {" + args + "}}";
  }
  return trace + "\n  ]\n}\n";
}

/// The Chrome trace LibTorch's profiler (Kineto) writes for `result`. Kineto writes only to a file, only once per
/// result, and says nothing when it cannot: it writes to a temporary file here, read back and removed.
inline std::string kineto_trace(torch::autograd::profiler::ProfilerResult& result) {
  static std::atomic<int> count{0};
  const auto temporary = std::filesystem::temp_directory_path() /
                         ("accel_trace_" + std::to_string(::getpid()) + "_" + std::to_string(count++) + ".json");
  const auto remove = scope_exit([&temporary] {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
  });
  result.save(temporary.string());
  std::ifstream in(temporary, std::ios::binary);
  if (!in)
    throw profile_error("accel::profiler: LibTorch's profiler did not write its trace to " + temporary.string() +
                        "; set TMPDIR to a directory this process can write");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

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
  profiler(profile_options options, int process_index, std::function<void()> wait_for_everyone)
      : options_(std::move(options)),
        process_index_(process_index),
        wait_for_everyone_(std::move(wait_for_everyone)),
        config_(detail::profiler_config(options_)),
        activities_(detail::profiler_activities(options_.activities)) {
    if (options_.schedule) detail::check_schedule(*options_.schedule);
    if (detail::profiler_alive.exchange(true)) throw detail::profiler_running();
    if (torch::profiler::impl::profilerEnabled()) {
      detail::profiler_alive = false;
      throw detail::profiler_running();
    }
    try {
      action_ = action_at(0);
      transit(profiler_action::none, action_);
      mark_step();
    } catch (...) {
      abandon();
      throw;
    }
  }
  profiler(const profiler&) = delete;
  profiler& operator=(const profiler&) = delete;
  ~profiler() {
    if (finished_) return;
    if (std::uncaught_exceptions() > uncaught_) {
      abandon();
      return;
    }
    try {
      finish();
    } catch (const std::exception& error) {
      std::cerr << detail::first_line(error.what())
                << " (at the end of an accel::profiler's scope; call finish() to handle this error)" << std::endl;
    } catch (...) {
      std::cerr << "accel::profiler: finishing the profile failed (call finish() to handle this error)" << std::endl;
    }
  }

  /// Ends the current step and starts the next: the profiler moves along its schedule (torch.profiler's `step`).
  void step() {
    if (finished_) throw std::logic_error("accel::profiler::step() after finish(): the profile has ended");
    step_mark_.reset();
    const auto previous = action_;
    action_ = action_at(++step_num_);
    transit(previous, action_);
    mark_step();
    rethrow_callback_failure();
  }

  /// Ends the profile (see the class): the callback for the open window; with `output_trace_dir`,
  /// `profile_{process_index}.json` and the wait for every process; then throws what failed, if anything. Does nothing
  /// the second time.
  void finish() {
    if (finished_) return;
    finished_ = true;
    std::exception_ptr failure;
    try {
      step_mark_.reset();
      transit(action_, std::nullopt);
      rethrow_callback_failure();
    } catch (...) {
      failure = std::current_exception();
    }
    abandon();
    if (options_.output_trace_dir) {  // a collective only then, as in Accelerate
      try {
        write_trace(*options_.output_trace_dir);
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
      wait_for_everyone_();
    }
    if (failure) std::rethrow_exception(failure);
  }

  /// Steps taken (`step()` calls): torch.profiler's `step_num`.
  [[nodiscard]] std::int64_t step_num() const noexcept { return step_num_; }
  /// What the profiler does during the current step.
  [[nodiscard]] profiler_action action() const noexcept { return action_; }
  /// Whether a window has been recorded (what the accessors below read).
  [[nodiscard]] bool has_trace() const noexcept { return result_ != nullptr; }

  /// The events of the last recorded window (none before the first window ends).
  [[nodiscard]] const std::vector<profile_event>& events() const {
    if (result_ && !events_) {
      events_.emplace();
      for (const auto& event : result_->events()) events_->push_back(detail::event_of(event));
    }
    static const std::vector<profile_event> none;
    return events_ ? *events_ : none;
  }
  /// The events of the last recorded window aggregated per name (torch.profiler's `key_averages()`; per name and
  /// input shapes with `group_by_input_shape`, which needs `record_shapes`): `.table(sort_by, row_limit)` prints them.
  [[nodiscard]] profile_averages key_averages(bool group_by_input_shape = false) const {
    return accel::key_averages(events(), group_by_input_shape);
  }
  /// The last recorded window in Chrome trace format (JSON; chrome://tracing, Perfetto, TensorBoard's profiler):
  /// LibTorch's own trace, or, for a LibTorch without Kineto (Debian's 1.13), accel's of the same events.
  [[nodiscard]] const std::string& chrome_trace() const {
    if (!result_) throw profile_error("accel::profiler: no trace: " + nothing_recorded());
    if (!trace_)
      trace_ =
          detail::compat::profiler_saves_traces ? detail::kineto_trace(*result_) : detail::chrome_trace_of(events());
    return *trace_;
  }
  /// Writes `chrome_trace()` to `path`, atomically.
  void export_chrome_trace(const std::filesystem::path& path) const {
    const auto& trace = chrome_trace();
    detail::write_atomically<profile_error>(path, [&trace](auto& out) { out.write(trace); });
  }

 private:
  [[nodiscard]] profiler_action action_at(std::int64_t step) const {
    return options_.schedule ? scheduled_action(*options_.schedule, step) : profiler_action::record;
  }

  /// torch.profiler.profile's transitions (its `action_map`) from one step's action to the next's (none: the end).
  void transit(profiler_action from, std::optional<profiler_action> to) {
    using enum profiler_action;
    const bool records = to == record || to == record_and_save;
    switch (from) {
      case none:
        if (to == warmup || records) prepare();
        if (records) start();
        break;
      case warmup:
        if (records) start();
        if (!to || to == none) close_prepared();
        break;
      case record:
        if (!to) {
          if (stop()) trace_ready();
        } else if (to == none || to == warmup) {  // not produced by profile_schedule
          stop();
        }
        break;
      case record_and_save:
        if (stop()) trace_ready();
        if (to == warmup || records) prepare();
        if (records) start();
        break;
    }
  }

  void prepare() {
    torch::autograd::profiler::prepareProfiler(config_, activities_);
    prepared_ = true;
  }
  void start() {
    torch::autograd::profiler::enableProfiler(config_, activities_);
    prepared_ = false;
    enabled_ = true;
  }
  /// Ends the recording window, if one is open (a callback that threw may have left none); returns whether one was.
  bool stop() {
    if (!std::exchange(enabled_, false)) return false;
    auto result = torch::autograd::profiler::disableProfiler();
    if (!result) return false;
    result_ = std::move(result);
    events_.reset();
    trace_.reset();
    return true;
  }
  /// Closes a session prepared (warming up) but never recorded, as torch.profiler does: started and stopped. What
  /// it holds is discarded: the last recorded window stays the one to write.
  void close_prepared() {
    torch::autograd::profiler::enableProfiler(config_, activities_);
    prepared_ = false;
    torch::autograd::profiler::disableProfiler();
  }
  /// Hands the window to `on_trace_ready`. What the callback throws waits until the transition is complete, so that
  /// the profiler follows its schedule still (the next window recorded), then leaves `step()` or `finish()`.
  void trace_ready() {
    if (!options_.on_trace_ready) return;
    try {
      options_.on_trace_ready(*this);
    } catch (...) {
      callback_failure_ = std::current_exception();
    }
  }
  void rethrow_callback_failure() {
    if (auto failure = std::exchange(callback_failure_, nullptr)) std::rethrow_exception(failure);
  }

  /// The `ProfilerStep#N` mark around each step, with a schedule (as torch.profiler does).
  void mark_step() {
    if (!options_.schedule) return;
    step_mark_.emplace(at::RecordScope::USER_SCOPE);
    if (step_mark_->isActive()) step_mark_->before(("ProfilerStep#" + std::to_string(step_num_)).c_str());
  }

  /// Stops LibTorch's profiler whatever state it is in, without a callback, and gives up this process's profiler.
  void abandon() noexcept {
    finished_ = true;
    step_mark_.reset();
    try {
      if (prepared_) close_prepared();
      if (enabled_) {
        enabled_ = false;
        torch::autograd::profiler::disableProfiler();
      }
    } catch (const std::exception& error) {
      std::cerr << "accel::profiler: stopping LibTorch's profiler failed: " << detail::first_line(error.what())
                << std::endl;
    }
    prepared_ = false;
    if (std::exchange(owns_flag_, false)) detail::profiler_alive = false;
  }

  [[nodiscard]] std::string nothing_recorded() const {
    if (!options_.schedule) return "the profile records one window, which ends with it (finish())";
    const auto& s = *options_.schedule;
    return "the schedule reached the end of no recording window in " + std::to_string(step_num_) +
           " steps (the first ends at step skip_first + wait + warmup + active = " +
           std::to_string(s.skip_first + s.wait + s.warmup + s.active) +
           "); call step() after each training step, or shorten the schedule";
  }

  void write_trace(const std::filesystem::path& directory) const {
    const auto file = directory / ("profile_" + std::to_string(process_index_) + ".json");
    std::error_code error;
    std::filesystem::create_directories(directory, error);
    if (error)
      throw profile_error("accel::profile: cannot create output_trace_dir " + directory.string() + " for " +
                          file.filename().string() + ": " + error.message() +
                          "; give output_trace_dir a directory this process can write");
    if (!result_)
      throw profile_error("accel::profile: nothing to write to " + file.string() + ": " + nothing_recorded());
    export_chrome_trace(file);
  }

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
