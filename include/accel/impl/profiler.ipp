/// \file
/// What profiler.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../profiler.hpp"

namespace accel {

std::ostream& operator<<(std::ostream& out, profiler_action action) {
  constexpr const char* names[] = {"none", "warmup", "record", "record_and_save"};
  return out << names[static_cast<int>(action)];
}

profiler_action scheduled_action(const profile_schedule& schedule, std::int64_t step) {
  if (step < schedule.skip_first) return profiler_action::none;
  step -= schedule.skip_first;
  const std::int64_t cycle = schedule.wait + schedule.warmup + schedule.active;
  if (schedule.repeat > 0 && step / cycle >= schedule.repeat) return profiler_action::none;
  const auto within = step % cycle;
  if (within < schedule.wait) return profiler_action::none;
  if (within < schedule.wait + schedule.warmup) return profiler_action::warmup;
  return within < cycle - 1 ? profiler_action::record : profiler_action::record_and_save;
}
}  // namespace accel

namespace accel::detail {

std::logic_error profiler_running() {
  return std::logic_error(
      "accel::accelerator::profile: a profiler is already running in this process (another profile() scope, or "
      "LibTorch's own profiler); LibTorch profiles one scope at a time: finish the other one first");
}

void check_schedule(const profile_schedule& s) {
  if (s.wait < 0 || s.warmup < 0 || s.active <= 0 || s.repeat < 0 || s.skip_first < 0)
    throw std::invalid_argument("accel::profile_schedule: wait = " + std::to_string(s.wait) +
                                " (need >= 0), warmup = " + std::to_string(s.warmup) + " (need >= 0), active = " +
                                std::to_string(s.active) + " (need > 0), repeat = " + std::to_string(s.repeat) +
                                " (need >= 0), skip_first = " + std::to_string(s.skip_first) + " (need >= 0)");
}

std::set<torch::profiler::impl::ActivityType> profiler_activities(const std::vector<profiler_activity>& asked) {
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

torch::profiler::impl::ProfilerConfig profiler_config(const profile_options& o) {
  return torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO,
                                               o.record_shapes || o.with_flops, o.profile_memory, o.with_stack,
                                               o.with_flops, o.with_modules);
}

profile_event event_of(const torch::autograd::profiler::KinetoEvent& e) {
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

std::string trace_microseconds(std::int64_t nanoseconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%lld.%03lld", static_cast<long long>(nanoseconds / 1000),
                static_cast<long long>(nanoseconds % 1000));
  return text;
}

std::string chrome_trace_of(const std::vector<profile_event>& events) {
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

std::string kineto_trace(torch::autograd::profiler::ProfilerResult& result) {
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
}  // namespace accel::detail

namespace accel {

profiler::profiler(profile_options options, int process_index, std::function<void()> wait_for_everyone)
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

profiler::~profiler() {
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

void profiler::step() {
  if (finished_) throw std::logic_error("accel::profiler::step() after finish(): the profile has ended");
  step_mark_.reset();
  const auto previous = action_;
  action_ = action_at(++step_num_);
  transit(previous, action_);
  mark_step();
  rethrow_callback_failure();
}

void profiler::finish() {
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

const std::vector<profile_event>& profiler::events() const {
  if (result_ && !events_) {
    events_.emplace();
    for (const auto& event : result_->events()) events_->push_back(detail::event_of(event));
  }
  static const std::vector<profile_event> none;
  return events_ ? *events_ : none;
}

const std::string& profiler::chrome_trace() const {
  if (!result_) throw profile_error("accel::profiler: no trace: " + nothing_recorded());
  if (!trace_)
    trace_ = detail::compat::profiler_saves_traces ? detail::kineto_trace(*result_) : detail::chrome_trace_of(events());
  return *trace_;
}

void profiler::export_chrome_trace(const std::filesystem::path& path) const {
  const auto& trace = chrome_trace();
  detail::write_atomically<profile_error>(path, [&trace](auto& out) { out.write(trace); });
}

profiler_action profiler::action_at(std::int64_t step) const {
  return options_.schedule ? scheduled_action(*options_.schedule, step) : profiler_action::record;
}

void profiler::transit(profiler_action from, std::optional<profiler_action> to) {
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

void profiler::prepare() {
  torch::autograd::profiler::prepareProfiler(config_, activities_);
  prepared_ = true;
}

void profiler::start() {
  torch::autograd::profiler::enableProfiler(config_, activities_);
  prepared_ = false;
  enabled_ = true;
}

bool profiler::stop() {
  if (!std::exchange(enabled_, false)) return false;
  auto result = torch::autograd::profiler::disableProfiler();
  if (!result) return false;
  result_ = std::move(result);
  events_.reset();
  trace_.reset();
  return true;
}

void profiler::close_prepared() {
  torch::autograd::profiler::enableProfiler(config_, activities_);
  prepared_ = false;
  torch::autograd::profiler::disableProfiler();
}

void profiler::trace_ready() {
  if (!options_.on_trace_ready) return;
  try {
    options_.on_trace_ready(*this);
  } catch (...) {
    callback_failure_ = std::current_exception();
  }
}

void profiler::rethrow_callback_failure() {
  if (auto failure = std::exchange(callback_failure_, nullptr)) std::rethrow_exception(failure);
}

void profiler::mark_step() {
  if (!options_.schedule) return;
  step_mark_.emplace(at::RecordScope::USER_SCOPE);
  if (step_mark_->isActive()) step_mark_->before(("ProfilerStep#" + std::to_string(step_num_)).c_str());
}

void profiler::abandon() noexcept {
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

std::string profiler::nothing_recorded() const {
  if (!options_.schedule) return "the profile records one window, which ends with it (finish())";
  const auto& s = *options_.schedule;
  return "the schedule reached the end of no recording window in " + std::to_string(step_num_) +
         " steps (the first ends at step skip_first + wait + warmup + active = " +
         std::to_string(s.skip_first + s.wait + s.warmup + s.active) +
         "); call step() after each training step, or shorten the schedule";
}

void profiler::write_trace(const std::filesystem::path& directory) const {
  const auto file = directory / ("profile_" + std::to_string(process_index_) + ".json");
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error)
    throw profile_error("accel::profile: cannot create output_trace_dir " + directory.string() + " for " +
                        file.filename().string() + ": " + error.message() +
                        "; give output_trace_dir a directory this process can write");
  if (!result_) throw profile_error("accel::profile: nothing to write to " + file.string() + ": " + nothing_recorded());
  export_chrome_trace(file);
}

}  // namespace accel
