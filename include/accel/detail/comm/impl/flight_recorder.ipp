/// \file
/// What flight_recorder.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../flight_recorder.hpp"

#include "../../support/atomic_file.hpp"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <stdexcept>

// GCC 12 at -O3 takes a moved pickle_value's std::variant for a string that may be uninitialized (a false positive,
// as the tests' -O1 note in tests/CMakeLists.txt says), which -Werror would make an error in the accel tool's build.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace accel::detail {

namespace flight_internals {

inline thread_local const char* caller_label = nullptr;

/// Set by SIGUSR1's handler, read by the hang watch's thread (no dump inside a signal handler: it takes a mutex).
inline std::atomic<bool> dump_signalled{false};

extern "C" inline void note_dump_signal(int) { dump_signalled.store(true); }

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// A whole number from the environment variable `name`, or `fallback` when unset; refused when malformed.
inline double number_from_environment(const char* name, double fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || value < 0)
    throw std::invalid_argument(std::string("accel: ") + name + "=" + text + " is not a number of at least 0");
  return value;
}

inline pickle_value sizes_of(const std::vector<std::vector<std::int64_t>>& sizes) {
  auto list = pickle_value::list();
  for (const auto& shape : sizes) {
    auto dims = pickle_value::list();
    for (auto d : shape) dims.push_back(d);
    list.push_back(std::move(dims));
  }
  return list;
}

inline pickle_value strings_of(const std::vector<std::string>& names) {
  auto list = pickle_value::list();
  for (const auto& name : names) list.push_back(name);
  return list;
}

inline pickle_value time_or_none(std::int64_t ns) { return ns == 0 ? pickle_value() : pickle_value(ns); }

/// One entry as PyTorch's dump writes it (FlightRecorder.hpp's keys); the issuing call is also its only frame, so
/// that torchfrtrace prints it as the collective's stack.
inline pickle_value entry_dict(const flight_entry& e, std::size_t group_index) {
  auto d = pickle_value::dict();
  d.set("record_id", static_cast<std::int64_t>(e.record_id));
  d.set("pg_id", static_cast<std::int64_t>(group_index));
  d.set("process_group", pickle_value::tuple({e.group, e.group}));
  d.set("collective_seq_id", static_cast<std::int64_t>(e.collective_seq_id));
  d.set("p2p_seq_id", static_cast<std::int64_t>(e.p2p_seq_id));
  d.set("op_id", static_cast<std::int64_t>(e.is_p2p ? e.p2p_seq_id : e.collective_seq_id));
  d.set("profiling_name", "gloo:" + e.operation);
  d.set("time_created_ns", e.time_created_ns);
  d.set("input_sizes", sizes_of(e.input_sizes));
  d.set("input_dtypes", strings_of(e.input_dtypes));
  d.set("output_sizes", sizes_of(e.output_sizes));
  d.set("output_dtypes", strings_of(e.output_dtypes));
  d.set("state", collective_state_name(e.state));
  d.set("time_discovered_started_ns", time_or_none(e.time_started_ns));
  d.set("time_discovered_completed_ns", time_or_none(e.time_completed_ns));
  d.set("retired", e.state == collective_state::completed);
  d.set("timeout_ms", e.timeout_ms);
  d.set("is_p2p", e.is_p2p);
  d.set("duration_ms", pickle_value());  // Gloo has no device events to time
  auto frame = pickle_value::dict();
  frame.set("name", e.issued_by.empty() ? std::string("(no accel call)") : "accel::" + e.issued_by);
  frame.set("filename", "accel");
  frame.set("line", 0);
  auto frames = pickle_value::list();
  if (!e.issued_by.empty()) frames.push_back(std::move(frame));
  d.set("frames", std::move(frames));
  d.set("issued_by", e.issued_by);
  return d;
}

inline std::string ranks_text(const std::vector<int>& ranks) {
  std::string text = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

}  // namespace flight_internals

const char* collective_state_name(collective_state state) noexcept {
  switch (state) {
    case collective_state::scheduled:
      return "scheduled";
    case collective_state::started:
      return "started";
    case collective_state::completed:
      return "completed";
  }
  return "scheduled";
}

flight_recorder& flight_recorder::process() {
  static flight_recorder* const recorder = new flight_recorder(static_cast<std::size_t>(
      flight_internals::number_from_environment("ACCEL_FLIGHT_RECORDER_ENTRIES", 2000)));  // never destroyed: the
                                                                                           // watch may still read it
  return *recorder;
}

flight_recorder::flight_recorder(std::size_t capacity) : ring_(capacity) {}

void flight_recorder::add_group(const std::string& name, std::vector<int> ranks, int rank, int world_size) {
  std::lock_guard lock(mutex_);
  if (world_size > 0) {  // the job's group
    rank_ = rank;
    world_size_ = world_size;
  }
  for (const auto& g : groups_)
    if (g.name == name) return;
  groups_.push_back({name, std::move(ranks)});
  counters_.emplace_back();
}

std::uint64_t flight_recorder::record(const std::string& group, std::string_view operation, bool is_p2p,
                                      const collective_operands& operands, std::chrono::milliseconds timeout) {
  if (ring_.empty()) return 0;
  const auto created = flight_internals::now_ns();
  std::lock_guard lock(mutex_);
  std::size_t g = 0;
  while (g < groups_.size() && groups_[g].name != group) ++g;
  if (g == groups_.size()) {  // a group the communicator did not name: recorded all the same
    groups_.push_back({group, {}});
    counters_.emplace_back();
  }
  auto& e = ring_[next_id_ % ring_.size()];
  e.record_id = next_id_++;
  e.group = group;
  e.is_p2p = is_p2p;
  e.collective_seq_id = is_p2p ? counters_[g].collectives : ++counters_[g].collectives;
  e.p2p_seq_id = is_p2p ? ++counters_[g].p2p : counters_[g].p2p;
  e.operation = operation;
  e.input_sizes = operands.input_sizes;
  e.output_sizes = operands.output_sizes;
  e.input_dtypes = operands.input_dtypes;
  e.output_dtypes = operands.output_dtypes;
  e.state = collective_state::scheduled;
  e.time_created_ns = created;
  e.time_started_ns = e.time_completed_ns = 0;
  e.timeout_ms = timeout.count();
  const char* caller = collective_caller::current();
  e.issued_by = caller != nullptr ? caller : "";
  return e.record_id + 1;  // 0 means "not recorded"
}

flight_entry* flight_recorder::slot_of(std::uint64_t record_id) {
  if (record_id == 0 || ring_.empty()) return nullptr;
  auto& e = ring_[(record_id - 1) % ring_.size()];
  return e.record_id == record_id - 1 ? &e : nullptr;  // else overwritten since
}

void flight_recorder::started(std::uint64_t record_id) {
  std::lock_guard lock(mutex_);
  if (auto* e = slot_of(record_id); e != nullptr && e->state == collective_state::scheduled) {
    e->state = collective_state::started;
    e->time_started_ns = flight_internals::now_ns();
  }
}

void flight_recorder::completed(std::uint64_t record_id) {
  std::lock_guard lock(mutex_);
  if (auto* e = slot_of(record_id); e != nullptr && e->state != collective_state::completed) {
    e->state = collective_state::completed;
    e->time_completed_ns = flight_internals::now_ns();
    if (e->time_started_ns == 0) e->time_started_ns = e->time_completed_ns;
  }
}

std::vector<flight_entry> flight_recorder::entries() const {
  std::lock_guard lock(mutex_);
  std::vector<flight_entry> out;
  const auto n = std::min<std::uint64_t>(next_id_, ring_.size());
  for (auto id = next_id_ - n; id < next_id_; ++id) out.push_back(ring_[id % ring_.size()]);
  return out;
}

std::optional<flight_entry> flight_recorder::oldest_pending() const {
  std::lock_guard lock(mutex_);
  const auto n = std::min<std::uint64_t>(next_id_, ring_.size());
  for (auto id = next_id_ - n; id < next_id_; ++id)
    if (ring_[id % ring_.size()].state != collective_state::completed) return ring_[id % ring_.size()];
  return std::nullopt;
}

std::vector<flight_group> flight_recorder::groups() const {
  std::lock_guard lock(mutex_);
  return groups_;
}

pickle_value flight_recorder::dump() const {
  const auto all = entries();
  const auto known = groups();
  auto pg_config = pickle_value::dict();
  auto pg_status = pickle_value::dict();
  for (const auto& g : known) {
    auto config = pickle_value::dict();
    config.set("name", g.name);
    config.set("desc", g.name);
    config.set("ranks", flight_internals::ranks_text(g.ranks));
    pg_config.set(g.name, std::move(config));
    std::int64_t enqueued = 0, started = 0, completed = 0;
    for (const auto& e : all) {
      if (e.group != g.name || e.is_p2p) continue;
      const auto seq = static_cast<std::int64_t>(e.collective_seq_id);
      enqueued = std::max(enqueued, seq);
      if (e.state != collective_state::scheduled) started = std::max(started, seq);
      if (e.state == collective_state::completed) completed = std::max(completed, seq);
    }
    auto status = pickle_value::dict();
    status.set("last_enqueued_collective", enqueued);
    status.set("last_started_collective", started);
    status.set("last_completed_collective", completed);
    pg_status.set(g.name, std::move(status));
  }
  auto list = pickle_value::list();
  for (const auto& e : all) {
    std::size_t g = 0;
    while (g < known.size() && known[g].name != e.group) ++g;
    list.push_back(flight_internals::entry_dict(e, g));
  }
  auto root = pickle_value::dict();
  root.set("version", "2.10");  // PyTorch's FlightRecorder.hpp version_val: the analyser checks it
  root.set("pg_config", std::move(pg_config));
  root.set("pg_status", std::move(pg_status));
  root.set("entries", std::move(list));
  root.set("rank", rank_);
  root.set("world_size", world_size_);
  return root;
}

collective_caller::collective_caller(const char* call) noexcept : previous_(flight_internals::caller_label) {
  if (previous_ == nullptr) flight_internals::caller_label = call;
}

collective_caller::~collective_caller() { flight_internals::caller_label = previous_; }

const char* collective_caller::current() noexcept { return flight_internals::caller_label; }

std::optional<std::string> flight_record_directory() {
  const char* dir = std::getenv("ACCEL_FLIGHT_RECORDER_DIR");
  if (dir == nullptr || *dir == '\0') return std::nullopt;
  return std::string(dir);
}

std::string dump_flight_record(std::optional<std::string> directory) {
  if (!directory) directory = flight_record_directory();
  if (!directory)
    throw std::invalid_argument("accel: dump_flight_record needs a directory, or ACCEL_FLIGHT_RECORDER_DIR set");
  auto& recorder = flight_recorder::process();
  const auto bytes = write_pickle(recorder.dump());
  std::error_code ignored;  // a directory that cannot be made fails the write below, which names it
  std::filesystem::create_directories(*directory, ignored);
  const auto rank = std::to_string(recorder.rank());
  const auto path = *directory + "/accel_trace_rank_" + rank;
  const auto partial = *directory + "/.partial-" + rank + ".part";  // no part of the prefix torchfrtrace infers
  write_atomically<std::runtime_error>(path, partial, [&](auto& out) { out.write(bytes.data(), bytes.size()); });
  return path;
}

std::chrono::milliseconds hang_timeout_from_environment(std::chrono::milliseconds configured) {
  const double seconds = flight_internals::number_from_environment("ACCEL_HANG_TIMEOUT",
                                                                   std::chrono::duration<double>(configured).count());
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

std::string describe_collective(const flight_entry& entry) {
  return "collective " + std::to_string(entry.is_p2p ? entry.p2p_seq_id : entry.collective_seq_id) + " (" +
         entry.operation + ") on group " + entry.group + ", state " + collective_state_name(entry.state) +
         ", issued by " + (entry.issued_by.empty() ? std::string("no accel call") : entry.issued_by);
}

hang_watch::hang_watch(flight_recorder& recorder, std::chrono::milliseconds timeout, hang_watch_links links)
    : recorder_(recorder),
      timeout_(timeout),
      links_(std::move(links)),
      thread_([this](const std::stop_token& stop) { run(stop); }) {
  struct sigaction previous{};
  if (!flight_record_directory() || sigaction(SIGUSR1, nullptr, &previous) != 0 || previous.sa_handler != SIG_DFL)
    return;  // a handler of the program's own stays
  struct sigaction action{};
  action.sa_handler = flight_internals::note_dump_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  handles_signal_ = sigaction(SIGUSR1, &action, nullptr) == 0;
}

hang_watch::~hang_watch() {
  thread_.request_stop();
  thread_.join();
  if (handles_signal_) std::signal(SIGUSR1, SIG_DFL);
}

void hang_watch::dump_on_signal() {
  if (!flight_internals::dump_signalled.exchange(false)) return;
  std::string outcome;
  try {
    outcome = "flight record in " + dump_flight_record();
  } catch (const std::exception& e) {
    outcome = e.what();
  }
  std::cerr << "accel: process " + std::to_string(recorder_.rank()) + ": SIGUSR1: " + outcome + "\n";
}

void hang_watch::run(const std::stop_token& stop) {
  const auto period = std::clamp(timeout_ / 10, std::chrono::milliseconds(20), std::chrono::milliseconds(500));
  bool store_gone = false;
  while (!stop.stop_requested()) {
    std::this_thread::sleep_for(period);
    dump_on_signal();
    if (auto stuck = recorder_.oldest_pending()) {
      const auto age = std::chrono::nanoseconds(flight_internals::now_ns() - stuck->time_created_ns);
      if (age > timeout_) end_hung(*stuck);
    }
    if (dumped_ || store_gone || !links_.dumps_requested) continue;
    try {
      if (!links_.dumps_requested()) continue;
    } catch (const std::exception&) {
      store_gone = true;  // the process that served the store ended: no request can come, hangs are still watched
      continue;
    }
    // One write, so that the line does not interleave with the other processes' on a shared stderr.
    std::cerr << "accel: process " + std::to_string(recorder_.rank()) + ": another process found a hang; " +
                     dump_once() + "\n";
  }
}

std::string hang_watch::dump_once() {
  if (dumped_) return "flight record already dumped";
  dumped_ = true;
  std::string outcome = "no flight record written (ACCEL_FLIGHT_RECORDER_DIR is not set)";
  try {
    if (flight_record_directory()) outcome = "flight record in " + dump_flight_record();
  } catch (const std::exception& e) {
    outcome = e.what();
  }
  try {
    if (links_.confirm_dump) links_.confirm_dump();  // once per process, so that the count reaches the job's size
  } catch (const std::exception&) {
    // The store is gone: nobody waits for the count any more.
  }
  return outcome;
}

void hang_watch::end_hung(const flight_entry& stuck) {
  try {
    if (links_.request_dumps) links_.request_dumps();
  } catch (const std::exception&) {
  }
  const auto waited =
      std::chrono::duration<double>(std::chrono::nanoseconds(flight_internals::now_ns() - stuck.time_created_ns));
  std::string outcome;
  try {
    outcome = dump_once();
  } catch (const std::exception& e) {
    outcome = e.what();
  }
  std::ostringstream line;
  line << "accel: hang: process " << recorder_.rank() << " waited " << waited.count() << " s for "
       << describe_collective(stuck) << " (hang timeout " << std::chrono::duration<double>(timeout_).count() << " s); "
       << outcome << "\n";
  std::cerr << line.str();  // one write: see run()
  try {
    // The others dump when their watch sees the request (within half a second): wait for them before this process
    // (perhaps the store's server) ends, but not for processes that are gone (a vanished machine never dumps):
    // 2 s without a new dump, 5 s at most.
    using clock = std::chrono::steady_clock;
    const auto deadline = clock::now() + std::chrono::seconds(5);
    auto last_news = clock::now();
    for (std::int64_t seen = 0; links_.dumped;) {
      const auto count = links_.dumped();
      if (count >= links_.world_size || clock::now() > deadline) break;
      if (count > seen) last_news = clock::now();
      if (clock::now() - last_news > std::chrono::seconds(2)) break;
      seen = count;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
  }
  std::_Exit(hang_exit_status);
}

}  // namespace accel::detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
