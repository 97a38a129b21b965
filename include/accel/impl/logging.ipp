/// \file
/// What logging.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../logging.hpp"

namespace accel {

log_level parse_log_level(std::string_view name) {
  std::string upper(name);
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& named : detail::log_level_names)
    if (named.name == upper) return named.level;
  throw std::invalid_argument("accel::get_logger: unknown log level \"" + std::string(name) +
                              "\"; use DEBUG, INFO, WARNING, ERROR or CRITICAL (any case; also WARN, FATAL, NOTSET)");
}

logger::logger(std::string name, log_level level, const process_environment& environment)
    : name_(std::move(name)), level_(level), process_index_(environment.rank), num_processes_(environment.world_size) {}

void logger::log(log_level level, std::string_view message, log_options options) const {
  if (!is_enabled_for(level)) return;
  if (!options.in_order) {
    if (!options.main_process_only || process_index_ == 0) write(level, message);
    return;
  }
  if (num_processes_ == 1) return write(level, message);
  const auto barrier = detail::process_barrier();
  if (!barrier)
    throw std::logic_error("accel::logger \"" + name_ + "\": in_order makes the " + std::to_string(num_processes_) +
                           " processes write in turn, waiting for one another at the job's barrier, and this "
                           "process has no process group yet: build the accelerator (data_parallel) before "
                           "logging in order, or log without in_order");
  for (int process = 0; process < num_processes_; ++process) {
    if (process == process_index_) write(level, message);
    barrier();
  }
}

logger& logger::set_stream(std::ostream& stream) noexcept {
  stream_ = &stream;
  return *this;
}

void logger::write(log_level level, std::string_view message) const {
  std::string line;
  line.append(log_level_name(level)).append(":").append(name_).append(":[RANK ");
  line.append(std::to_string(process_index_)).append("] ").append(message).append("\n");
  static std::mutex writing;  // whole lines, when threads log at once
  std::lock_guard lock(writing);
  stream_->write(line.data(), static_cast<std::streamsize>(line.size()));
  stream_->flush();
}

logger get_logger(std::string name, std::optional<log_level> level) {
  if (!level) {
    if (const auto variable = detail::read_variable("ACCELERATE_LOG_LEVEL")) {
      try {
        level = parse_log_level(variable->value);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string(e.what()) + " (from the ACCELERATE_LOG_LEVEL environment variable)");
      }
    }
  }
  return logger(std::move(name), level.value_or(log_level::warning), read_process_environment());
}

}  // namespace accel
