/// \file
/// What config_file.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../config_file.hpp"

namespace accel {

bool has_parallelism_config(const config_values& values) {
  return std::any_of(values.parallelism_config.begin(), values.parallelism_config.end(),
                     [](const auto& size) { return size.has_value(); });
}

mesh_sizes parallelism_sizes(const config_values& values, mesh_sizes base) {
  for (std::size_t i = 0; i < detail::mesh_size_variables.size(); ++i)
    if (const auto& size = values.parallelism_config[i]) base.*detail::mesh_size_variables[i].size = *size;
  return base;
}
}  // namespace accel

namespace accel::detail {

int config_number(std::string_view text, int low, int high) {
  int number = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size() || number < low || number > high)
    throw config_error("");
  return number;
}

bool is_parallelism_key(std::string_view key) {
  return key == cp_comm_strategy_key || std::any_of(mesh_size_variables.begin(), mesh_size_variables.end(),
                                                    [&](const auto& entry) { return entry.config_key == key; });
}

void set_cp_comm_strategy(config_values& values, std::string_view text) {
  if (text != "allgather" && text != "alltoall") throw config_error("");
  values.cp_comm_strategy = std::string(text);
}

void set_mixed_precision(config_values& values, std::string_view text) {
  if (text != "no" && text != "bf16" && text != "fp16" && text != "fp8") throw config_error("");
  values.mixed_precision = std::string(text);
}

void set_distributed_type(config_values& values, std::string_view text) {
  if (text != "NO" && text != "MULTI_CPU" && text != "MULTI_GPU" && text != "FSDP" && text != "DEEPSPEED")
    throw config_error("");
  values.distributed_type = std::string(text);
}

void set_main_process_ip(config_values& values, std::string_view text) {
  if (text.empty()) throw config_error("");
  values.main_process_ip = std::string(text);
}

std::string config_key_names() {
  std::string names;
  for (const config_key& key : config_keys) append_item(names, key.name);
  return names;
}

std::string excerpt(std::string_view text) {
  constexpr std::size_t shown = 80;
  if (text.size() <= shown) return std::string(text);
  return std::string(text.substr(0, shown)) + "... (" + std::to_string(text.size()) + " characters)";
}

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

std::string_view without_comment(std::string_view line) {
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

std::string_view unquote(std::string_view value) {
  if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
    return value.substr(1, value.size() - 2);
  return value;
}

bool places_block(config_block& block, std::string_view line, std::string_view key, std::string_view value,
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
  // Accelerate's other block keys (cp_backend, ...) are left to set_config_value: unknown here.
  if (!block_key && block == config_block::parallelism && !key.starts_with("parallelism_config_"))
    throw config_error(where + ": '" + excerpt(key) +
                       "' is indented under 'parallelism_config:', which holds only parallelism_config_dp_replicate_"
                       "size, parallelism_config_dp_shard_size, parallelism_config_cp_size, "
                       "parallelism_config_tp_size, parallelism_config_pp_size and "
                       "parallelism_config_cp_comm_strategy; write it at the start "
                       "of its line");
  return false;
}
}  // namespace accel::detail

namespace accel {

void set_config_value(config_values& values, std::string_view key, std::string_view value, const std::string& where) {
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

void check_config(const config_values& values, const std::string& where) {
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

config_values parse_config(std::string_view text, const std::string& name) {
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

std::string format_config(const config_values& values) {
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

std::optional<std::filesystem::path> config_file_path() {
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

config_values read_config_file(const std::filesystem::path& path) {
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

std::optional<std::filesystem::path> config_file_in_use() {
  auto path = config_file_path();
  std::error_code ignored;
  if (path && std::getenv("ACCEL_CONFIG_FILE") == nullptr && !std::filesystem::exists(*path, ignored)) return {};
  return path;
}

config_values read_config_file() {
  const auto path = config_file_in_use();
  return path ? read_config_file(*path) : config_values{};
}

void write_config_file(const std::filesystem::path& path, const config_values& values) {
  std::error_code error;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), error);
  if (error)
    throw config_error("cannot create the directory " + path.parent_path().string() +
                       " for the config file: " + error.message());
  detail::write_atomically<config_error>(path, [&](auto& out) { out.write(format_config(values)); });
}

}  // namespace accel
