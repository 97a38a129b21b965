/// \file
/// `accel::get_logger(name)`: Accelerate's `get_logger` (a logger behind its `MultiProcessAdapter`) for a C++
/// program. A line is written on the main process only unless a call says otherwise (`main_process_only = false`:
/// every process; `in_order`: every process in turn, process 0 first). Lines look like those of Python's logging
/// under `basicConfig`, with Accelerate's rank prefix: `INFO:train:[RANK 0] epoch 1 done`, on standard error.
#pragma once

#include <array>
#include <cctype>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "detail/config.hpp"
#include "detail/comm/process_barrier.hpp"
#include "launch.hpp"

namespace accel {

/// The levels of Python's logging, with its numbers: a logger writes the calls at its level and above.
enum class log_level : int { notset = 0, debug = 10, info = 20, warning = 30, error = 40, critical = 50 };

namespace detail {
struct named_level {
  std::string_view name;
  log_level level;
};
/// Python's names of the levels (`logging._nameToLevel`), each level's own name first.
inline constexpr std::array<named_level, 8> log_level_names{{{"CRITICAL", log_level::critical},
                                                             {"ERROR", log_level::error},
                                                             {"WARNING", log_level::warning},
                                                             {"INFO", log_level::info},
                                                             {"DEBUG", log_level::debug},
                                                             {"NOTSET", log_level::notset},
                                                             {"WARN", log_level::warning},
                                                             {"FATAL", log_level::critical}}};
}  // namespace detail

/// The name Python's logging gives `level` ("INFO", "WARNING", ...), as it appears in a line.
[[nodiscard]] constexpr std::string_view log_level_name(log_level level) noexcept {
  for (const auto& named : detail::log_level_names)
    if (named.level == level) return named.name;
  return "NOTSET";
}

/// The level named `name`, in any case, as Python's `Logger.setLevel(name.upper())` reads it: DEBUG, INFO,
/// WARNING (WARN), ERROR, CRITICAL (FATAL), NOTSET. Throws `std::invalid_argument` listing them otherwise.
[[nodiscard]] ACCEL_DECL log_level parse_log_level(std::string_view name);

/// Where a call writes, as Accelerate's `main_process_only` and `in_order` keyword arguments.
struct log_options {
  /// Only the main process (process 0) writes the line; false: every process writes its own.
  bool main_process_only = true;
  /// Every process writes its line in turn, process 0 first, each waiting at a barrier for the one before (so
  /// `main_process_only` is ignored). A collective: every process must make the call. It needs the job's process
  /// group, so with several processes an accelerator (data_parallel) must exist first.
  bool in_order = false;
};

/// A process-aware logger: `get_logger` makes one. Each call writes one line, in one piece, flushed.
class logger {
 public:
  /// A logger for `name` at `level`, in the process `environment` describes.
  ACCEL_DECL logger(std::string name, log_level level, const process_environment& environment);

  void debug(std::string_view message, log_options options = {}) const { log(log_level::debug, message, options); }
  void info(std::string_view message, log_options options = {}) const { log(log_level::info, message, options); }
  void warning(std::string_view message, log_options options = {}) const { log(log_level::warning, message, options); }
  void error(std::string_view message, log_options options = {}) const { log(log_level::error, message, options); }
  void critical(std::string_view message, log_options options = {}) const {
    log(log_level::critical, message, options);
  }
  /// `warning`, but each distinct message only the first time this logger is given it (Accelerate's
  /// `warning_once`).
  void warning_once(std::string_view message, log_options options = {}) {
    if (warned_.emplace(message).second) warning(message, options);
  }

  /// Writes `message` at `level` where `options` say, when the logger's level lets it through. With `in_order` and
  /// several processes, throws `std::logic_error` when no process group exists yet to order them.
  ACCEL_DECL void log(log_level level, std::string_view message, log_options options = {}) const;

  /// Whether a call at `level` writes anything (Python's `isEnabledFor`).
  [[nodiscard]] bool is_enabled_for(log_level level) const noexcept {
    return static_cast<int>(level) >= static_cast<int>(level_);
  }
  [[nodiscard]] log_level level() const noexcept { return level_; }
  void set_level(log_level level) noexcept { level_ = level; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// Where lines go: standard error by default (Python's `basicConfig`); a file or a string stream to capture them.
  /// The stream must outlive the logger's use of it.
  ACCEL_DECL logger& set_stream(std::ostream& stream) noexcept;

 private:
  /// `LEVEL:name:[RANK i] message`, Python's default format around Accelerate's message, in one write.
  ACCEL_DECL void write(log_level level, std::string_view message) const;

  std::string name_;
  log_level level_;
  int process_index_;
  int num_processes_;
  std::ostream* stream_ = &std::cerr;
  std::set<std::string, std::less<>> warned_;
};

/// A logger for `name` (Accelerate's `get_logger(name, log_level)`), at `level`; without one, at the level the
/// `ACCELERATE_LOG_LEVEL` variable names; without it, WARNING (Python's default, which Accelerate leaves in place:
/// info and debug lines are dropped until asked for). The process's index and count come from the launcher's
/// environment (`read_process_environment()`), so no accelerator is needed, except for `in_order` on several
/// processes. Unlike Python's, loggers of the same name are independent values: set the level of the one you keep.
///
///     auto log = accel::get_logger("train", accel::log_level::info);
///     log.info("epoch 1 done");                                 // process 0 only
///     log.info("my shard: 250 samples", {.main_process_only = false});
///     log.info("in turn", {.in_order = true});                  // 0, then 1, ...
[[nodiscard]] ACCEL_DECL logger get_logger(std::string name, std::optional<log_level> level = std::nullopt);

/// The same with the level by name, as Accelerate's `log_level="DEBUG"` (any case; `parse_log_level`).
[[nodiscard]] inline logger get_logger(std::string name, std::string_view level) {
  return get_logger(std::move(name), parse_log_level(level));
}

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/logging.ipp"
#endif
