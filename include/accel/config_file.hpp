/// \file
/// The run's config file: a few `key: value` lines (a subset of YAML, with Accelerate's key names) that
/// `accel config` writes, `accel launch` reads for its defaults, and `accel::read_run_config()` reads for
/// `accel::dispatch`:
///
///     # accel config file
///     mixed_precision: bf16
///     gradient_accumulation_steps: 4
///     distributed_type: MULTI_CPU
///     num_processes: 4
///     parallelism_config:
///       parallelism_config_dp_shard_size: 2
///       parallelism_config_tp_size: 2
///
/// Where it is: `$ACCEL_CONFIG_FILE` when set (empty: no config file at all), otherwise
/// `$XDG_CONFIG_HOME/accel/default_config.yaml` (`~/.config/accel/default_config.yaml`), read only if it exists.
/// Plain C++ without LibTorch: the `accel` command-line tool includes it too.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "detail/support/atomic_file.hpp"
#include "detail/support/text.hpp"
#include "device_mesh.hpp"

namespace accel {

/// A config file, or a config value, that cannot be used; the message names the file, the line and the fix.
struct config_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What a config file may hold; a key the file does not set stays empty.
struct config_values {
  std::optional<std::string> mixed_precision;      // no, bf16, fp16 or fp8
  std::optional<int> gradient_accumulation_steps;  // >= 1
  std::optional<std::string> distributed_type;     // NO, MULTI_CPU, MULTI_GPU, FSDP or DEEPSPEED
  std::optional<int> num_processes;                // in the whole job, over every machine (as Accelerate)
  std::optional<int> num_machines;                 // >= 1
  std::optional<int> machine_rank;                 // this machine's index, 0 on the main one
  std::optional<std::string> main_process_ip;      // the main machine's host name or address
  std::optional<int> main_process_port;            // 0 to 65535 (0: `accel launch` picks a free one)
  /// The `parallelism_config:` block's sizes (Accelerate's ParallelismConfig), in the order of
  /// `detail::mesh_size_variables`: dp_replicate, dp_shard, cp, tp.
  std::array<std::optional<int>, 4> parallelism_config;
};

/// Whether `values` sets any size of the `parallelism_config:` block.
inline bool has_parallelism_config(const config_values& values) {
  return std::any_of(values.parallelism_config.begin(), values.parallelism_config.end(),
                     [](const auto& size) { return size.has_value(); });
}

/// `base` with the sizes that `values` sets in its `parallelism_config:` block.
inline mesh_sizes parallelism_sizes(const config_values& values, mesh_sizes base = {}) {
  for (std::size_t i = 0; i < detail::mesh_size_variables.size(); ++i)
    if (const auto& size = values.parallelism_config[i]) base.*detail::mesh_size_variables[i].size = *size;
  return base;
}

namespace detail {

/// One key of the file: its name, what it accepts (for messages), and where its value goes.
struct config_key {
  std::string_view name;
  std::string_view accepts;
  void (*set)(config_values&, std::string_view value);  // throws config_error(accepts) on a bad value
  std::optional<std::string> (*get)(const config_values&);
};

/// The whole number `text`, from low to high; config_error otherwise (set_config_value writes its message).
inline int config_number(std::string_view text, int low, int high) {
  int number = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size() || number < low || number > high)
    throw config_error("");
  return number;
}

template <std::optional<int> config_values::* field, int low, int high>
void set_number(config_values& values, std::string_view text) {
  values.*field = config_number(text, low, high);
}

template <std::optional<int> config_values::* field>
std::optional<std::string> get_number(const config_values& values) {
  if (!(values.*field)) return std::nullopt;
  return std::to_string(*(values.*field));
}

template <std::size_t index>
void set_parallelism_size(config_values& values, std::string_view text) {
  values.parallelism_config[index] = config_number(text, 1, 65536);
}

template <std::size_t index>
std::optional<std::string> get_parallelism_size(const config_values& values) {
  if (!values.parallelism_config[index]) return std::nullopt;
  return std::to_string(*values.parallelism_config[index]);
}

/// A key of the `parallelism_config:` block (Accelerate nests them there).
inline bool is_parallelism_key(std::string_view key) {
  return std::any_of(mesh_size_variables.begin(), mesh_size_variables.end(),
                     [&](const auto& entry) { return entry.config_key == key; });
}

inline void set_mixed_precision(config_values& values, std::string_view text) {
  if (text != "no" && text != "bf16" && text != "fp16" && text != "fp8") throw config_error("");
  values.mixed_precision = std::string(text);
}

/// Accelerate's `distributed_type` values that a built-in parallel policy declares (its `distributed_type()`).
inline void set_distributed_type(config_values& values, std::string_view text) {
  if (text != "NO" && text != "MULTI_CPU" && text != "MULTI_GPU" && text != "FSDP" && text != "DEEPSPEED")
    throw config_error("");
  values.distributed_type = std::string(text);
}

inline void set_main_process_ip(config_values& values, std::string_view text) {
  if (text.empty()) throw config_error("");
  values.main_process_ip = std::string(text);
}

inline constexpr config_key config_keys[] = {
    {"mixed_precision", "no, bf16, fp16 or fp8", set_mixed_precision,
     [](const config_values& v) { return v.mixed_precision; }},
    {"gradient_accumulation_steps", "a whole number from 1 to 1000000",
     set_number<&config_values::gradient_accumulation_steps, 1, 1000000>,
     get_number<&config_values::gradient_accumulation_steps>},
    {"distributed_type", "NO, MULTI_CPU, MULTI_GPU, FSDP or DEEPSPEED", set_distributed_type,
     [](const config_values& v) { return v.distributed_type; }},
    {"num_processes", "a whole number from 1 to 67108864 (processes in the whole job)",
     set_number<&config_values::num_processes, 1, 67108864>, get_number<&config_values::num_processes>},
    {"num_machines", "a whole number from 1 to 65536", set_number<&config_values::num_machines, 1, 65536>,
     get_number<&config_values::num_machines>},
    {"machine_rank", "a whole number from 0 to 65535 (0 on the main machine)",
     set_number<&config_values::machine_rank, 0, 65535>, get_number<&config_values::machine_rank>},
    {"main_process_ip", "the main machine's host name or IP address", set_main_process_ip,
     [](const config_values& v) { return v.main_process_ip; }},
    {"main_process_port", "a TCP port from 0 to 65535 (0: accel launch picks a free one)",
     set_number<&config_values::main_process_port, 0, 65535>, get_number<&config_values::main_process_port>},
    {mesh_size_variables[0].config_key, "a whole number from 1 to 65536 (1: no replicas)", set_parallelism_size<0>,
     get_parallelism_size<0>},
    {mesh_size_variables[1].config_key, "a whole number from 1 to 65536 (1: no sharding)", set_parallelism_size<1>,
     get_parallelism_size<1>},
    {mesh_size_variables[2].config_key, "a whole number from 1 to 65536 (1: no context parallelism)",
     set_parallelism_size<2>, get_parallelism_size<2>},
    {mesh_size_variables[3].config_key, "a whole number from 1 to 65536 (1: no tensor parallelism)",
     set_parallelism_size<3>, get_parallelism_size<3>},
};

inline std::string config_key_names() {
  std::string names;
  for (const config_key& key : config_keys) append_item(names, key.name);
  return names;
}

/// At most the first 80 characters of `text` for a message, with how much was left out: a 60 MB line must not
/// make a 60 MB error.
inline std::string excerpt(std::string_view text) {
  constexpr std::size_t shown = 80;
  if (text.size() <= shown) return std::string(text);
  return std::string(text.substr(0, shown)) + "... (" + std::to_string(text.size()) + " characters)";
}

inline std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

/// The line without its comment: from a '#' outside quotes to the end.
inline std::string_view without_comment(std::string_view line) {
  char quote = '\0';
  for (std::size_t i = 0; i < line.size(); ++i) {
    if (quote != '\0') {
      if (line[i] == quote) quote = '\0';
    } else if (line[i] == '"' || line[i] == '\'') {
      quote = line[i];
    } else if (line[i] == '#') {
      return line.substr(0, i);
    }
  }
  return line;
}

/// The value as YAML writes a scalar: quotes around it are not part of it.
inline std::string_view unquote(std::string_view value) {
  if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
    return value.substr(1, value.size() - 2);
  return value;
}

/// Where a line of the file is: at the top level, or in the `parallelism_config:` block (its indented lines).
enum class config_block { none, parallelism };

/// Follows the `parallelism_config:` block as Accelerate's YAML nests it: true for the block's own line (nothing to
/// set); throws config_error for a block key outside the block or another key inside it.
inline bool places_block(config_block& block, std::string_view line, std::string_view key, std::string_view value,
                         const std::string& where) {
  const bool indented = line.starts_with(' ') || line.starts_with('\t');
  if (!indented) block = config_block::none;
  if (!indented && key == "parallelism_config" && (value.empty() || value == "{}")) {
    block = config_block::parallelism;
    return true;
  }
  const bool block_key = is_parallelism_key(key);
  if (block_key && block != config_block::parallelism)
    throw config_error(where + ": " + excerpt(key) +
                       " belongs in the parallelism_config block, indented under it as Accelerate writes it: a line "
                       "'parallelism_config:', then '  " +
                       excerpt(key) + ": N'");
  // Accelerate's other block keys (cp_comm_strategy, ...) are left to set_config_value: unknown here.
  if (!block_key && block == config_block::parallelism && !key.starts_with("parallelism_config_"))
    throw config_error(where + ": '" + excerpt(key) +
                       "' is indented under 'parallelism_config:', which holds only parallelism_config_dp_replicate_"
                       "size, parallelism_config_dp_shard_size, parallelism_config_cp_size and "
                       "parallelism_config_tp_size; write it at the start of its line");
  return false;
}

}  // namespace detail

/// Sets `key` to `value` in `values`, checked as the file's line would be. `where` prefixes the message (a file
/// and line, or a command-line flag). Throws config_error naming the keys or the values that are accepted.
inline void set_config_value(config_values& values, std::string_view key, std::string_view value,
                             const std::string& where) {
  const auto* found = std::find_if(std::begin(detail::config_keys), std::end(detail::config_keys),
                                   [&](const detail::config_key& k) { return k.name == key; });
  if (found == std::end(detail::config_keys))
    throw config_error(where + ": unknown key '" + detail::excerpt(key) + "'; the keys are " +
                       detail::config_key_names());
  try {
    found->set(values, value);
  } catch (const config_error&) {
    throw config_error(where + ": " + std::string(key) + " must be " + std::string(found->accepts) + ", not '" +
                       detail::excerpt(value) + "'");
  }
}

/// The checks that involve more than one key: every machine runs as many processes, the machine rank is one of the
/// machines, and the `parallelism_config:` sizes fit num_processes (`accel::validate_mesh`).
inline void check_config(const config_values& values, const std::string& where) {
  const int machines = values.num_machines.value_or(1);
  if (values.num_processes && *values.num_processes % machines != 0)
    throw config_error(where + ": num_processes " + std::to_string(*values.num_processes) +
                       " is not a multiple of num_machines " + std::to_string(machines) +
                       ": num_processes counts the processes of the whole job, the same number on every machine");
  if (values.machine_rank && *values.machine_rank >= machines)
    throw config_error(where + ": machine_rank " + std::to_string(*values.machine_rank) +
                       " is out of range for num_machines " + std::to_string(machines) + " (0 to " +
                       std::to_string(machines - 1) + ", 0 on the main machine)");
  if (!has_parallelism_config(values) || !values.num_processes) return;
  try {
    validate_mesh(parallelism_sizes(values), values.num_processes.value_or(1));
  } catch (const mesh_error& e) {
    throw config_error(where + ": the parallelism_config block with num_processes " +
                       std::to_string(*values.num_processes) + ": " + e.what());
  }
}

/// Parses a config file's text; `name` (the file's path) goes into the messages.
inline config_values parse_config(std::string_view text, const std::string& name) {
  config_values values;
  detail::config_block block = detail::config_block::none;
  // A UTF-8 byte-order mark, which many Windows editors write first, is not part of the first key.
  if (constexpr std::string_view byte_order_mark = "\xEF\xBB\xBF"; text.starts_with(byte_order_mark))
    text.remove_prefix(byte_order_mark.size());
  std::istringstream lines{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    const std::string where = name + ":" + std::to_string(number);
    std::string_view content = detail::without_comment(line);
    content = detail::trim(content);
    if (content.empty() || content == "---") continue;
    const auto colon = content.find(':');
    if (colon == std::string_view::npos)
      throw config_error(where + ": expected 'key: value' (e.g. 'mixed_precision: bf16'), found '" +
                         detail::excerpt(line) + "'");
    const auto key = detail::trim(content.substr(0, colon));
    const auto value = detail::unquote(detail::trim(content.substr(colon + 1)));
    if (detail::places_block(block, line, key, value, where)) continue;
    set_config_value(values, key, value, where);
  }
  check_config(values, name);
  return values;
}

/// The config file's text for `values` (only the keys that are set), as `accel config` writes it.
inline std::string format_config(const config_values& values) {
  std::string text =
      "# accel config file: read by `accel launch` and accel::read_run_config(); written by `accel config`\n";
  std::string block;  // Accelerate nests the sizes under parallelism_config:
  for (const detail::config_key& key : detail::config_keys)
    if (auto value = key.get(values)) {
      const std::string entry = std::string(key.name) + ": " + *value + "\n";
      if (detail::is_parallelism_key(key.name))
        block += "  " + entry;
      else
        text += entry;
    }
  if (!block.empty()) text += "parallelism_config:\n" + block;
  return text;
}

/// The config file in use: `$ACCEL_CONFIG_FILE` when set (empty: none), otherwise
/// `$XDG_CONFIG_HOME/accel/default_config.yaml` or `$HOME/.config/accel/default_config.yaml` (none without HOME).
inline std::optional<std::filesystem::path> config_file_path() {
  if (const char* explicit_path = std::getenv("ACCEL_CONFIG_FILE")) {
    if (*explicit_path == '\0') return std::nullopt;
    return std::filesystem::path(explicit_path);
  }
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && *xdg != '\0')
    return std::filesystem::path(xdg) / "accel" / "default_config.yaml";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::filesystem::path(home) / ".config" / "accel" / "default_config.yaml";
  return std::nullopt;
}

/// Reads and parses the file at `path`. Throws config_error when it cannot be read or parsed.
inline config_values read_config_file(const std::filesystem::path& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored))
    throw config_error("the config file " + path.string() +
                       " is a directory; name a file (accel config "
                       "--config_file FILE writes one), or set ACCEL_CONFIG_FILE empty for no config file");
  std::ifstream in(path);
  if (!in)
    throw config_error("cannot read the config file " + path.string() +
                       ": it does not exist or is not readable; write it with `accel config --config_file " +
                       path.string() + "`, or name another (ACCEL_CONFIG_FILE empty: no config file)");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse_config(text, path.string());
}

/// The config file to read: the one ACCEL_CONFIG_FILE names (which must then exist: reading it says so), or the
/// default one when it exists; none otherwise.
inline std::optional<std::filesystem::path> config_file_in_use() {
  auto path = config_file_path();
  std::error_code ignored;
  if (path && std::getenv("ACCEL_CONFIG_FILE") == nullptr && !std::filesystem::exists(*path, ignored)) return {};
  return path;
}

/// The values of the config file in use (config_file_in_use): nothing set when there is none.
inline config_values read_config_file() {
  const auto path = config_file_in_use();
  return path ? read_config_file(*path) : config_values{};
}

/// Writes `values` to `path` atomically (a temporary file renamed over it), creating the directories.
inline void write_config_file(const std::filesystem::path& path, const config_values& values) {
  std::error_code error;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), error);
  if (error)
    throw config_error("cannot create the directory " + path.parent_path().string() +
                       " for the config file: " + error.message());
  detail::write_atomically<config_error>(path, [&](auto& out) { out.write(format_config(values)); });
}

}  // namespace accel
