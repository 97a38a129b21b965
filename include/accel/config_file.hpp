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

#include "detail/config.hpp"
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
  /// `detail::mesh_size_variables`: dp_replicate, dp_shard, cp, tp, pp.
  std::array<std::optional<int>, 5> parallelism_config;
  /// The block's parallelism_config_cp_comm_strategy: allgather or alltoall (accel::cp_comm_strategy).
  std::optional<std::string> cp_comm_strategy;
};

/// Whether `values` sets any size of the `parallelism_config:` block.
ACCEL_DECL bool has_parallelism_config(const config_values& values);

/// `base` with the sizes that `values` sets in its `parallelism_config:` block.
ACCEL_DECL mesh_sizes parallelism_sizes(const config_values& values, mesh_sizes base = {});

namespace detail {

/// One key of the file: its name, what it accepts (for messages), and where its value goes.
struct config_key {
  std::string_view name;
  std::string_view accepts;
  void (*set)(config_values&, std::string_view value);  // throws config_error(accepts) on a bad value
  std::optional<std::string> (*get)(const config_values&);
};

/// The whole number `text`, from low to high; config_error otherwise (set_config_value writes its message).
ACCEL_DECL int config_number(std::string_view text, int low, int high);

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
ACCEL_DECL bool is_parallelism_key(std::string_view key);

ACCEL_DECL void set_mixed_precision(config_values& values, std::string_view text);

/// Accelerate's `distributed_type` values that a built-in parallel policy declares (its `distributed_type()`).
ACCEL_DECL void set_distributed_type(config_values& values, std::string_view text);

ACCEL_DECL void set_main_process_ip(config_values& values, std::string_view text);

ACCEL_DECL void set_cp_comm_strategy(config_values& values, std::string_view text);

/// The block's key of context parallelism's rotation, and the variable it becomes in the workers' environment.
inline constexpr std::string_view cp_comm_strategy_key = "parallelism_config_cp_comm_strategy";
inline constexpr std::string_view cp_comm_strategy_variable = "PARALLELISM_CONFIG_CP_COMM_STRATEGY";

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
    {mesh_size_variables[4].config_key, "a whole number from 1 to 65536 (1: no pipeline stages)",
     set_parallelism_size<4>, get_parallelism_size<4>},
    {cp_comm_strategy_key, "allgather or alltoall (how context parallelism passes keys and values)",
     set_cp_comm_strategy, [](const config_values& v) { return v.cp_comm_strategy; }},
};

ACCEL_DECL std::string config_key_names();

/// At most the first 80 characters of `text` for a message, with how much was left out: a 60 MB line must not
/// make a 60 MB error.
ACCEL_DECL std::string excerpt(std::string_view text);

ACCEL_DECL std::string_view trim(std::string_view text);

/// The line without its comment: from a '#' outside quotes to the end.
ACCEL_DECL std::string_view without_comment(std::string_view line);

/// The value as YAML writes a scalar: quotes around it are not part of it.
ACCEL_DECL std::string_view unquote(std::string_view value);

/// Where a line of the file is: at the top level, or in the `parallelism_config:` block (its indented lines).
enum class config_block { none, parallelism };

/// Follows the `parallelism_config:` block as Accelerate's YAML nests it: true for the block's own line (nothing to
/// set); throws config_error for a block key outside the block or another key inside it.
ACCEL_DECL bool places_block(config_block& block, std::string_view line, std::string_view key, std::string_view value,
                             const std::string& where);

}  // namespace detail

/// Sets `key` to `value` in `values`, checked as the file's line would be. `where` prefixes the message (a file
/// and line, or a command-line flag). Throws config_error naming the keys or the values that are accepted.
ACCEL_DECL void set_config_value(config_values& values, std::string_view key, std::string_view value,
                                 const std::string& where);

/// The checks that involve more than one key: every machine runs as many processes, the machine rank is one of the
/// machines, and the `parallelism_config:` sizes fit num_processes (`accel::validate_mesh`).
ACCEL_DECL void check_config(const config_values& values, const std::string& where);

/// Parses a config file's text; `name` (the file's path) goes into the messages.
ACCEL_DECL config_values parse_config(std::string_view text, const std::string& name);

/// The config file's text for `values` (only the keys that are set), as `accel config` writes it.
ACCEL_DECL std::string format_config(const config_values& values);

/// The config file in use: `$ACCEL_CONFIG_FILE` when set (empty: none), otherwise
/// `$XDG_CONFIG_HOME/accel/default_config.yaml` or `$HOME/.config/accel/default_config.yaml` (none without HOME).
ACCEL_DECL std::optional<std::filesystem::path> config_file_path();

/// Reads and parses the file at `path`. Throws config_error when it cannot be read or parsed.
ACCEL_DECL config_values read_config_file(const std::filesystem::path& path);

/// The config file to read: the one ACCEL_CONFIG_FILE names (which must then exist: reading it says so), or the
/// default one when it exists; none otherwise.
ACCEL_DECL std::optional<std::filesystem::path> config_file_in_use();

/// The values of the config file in use (config_file_in_use): nothing set when there is none.
ACCEL_DECL config_values read_config_file();

/// Writes `values` to `path` atomically (a temporary file renamed over it), creating the directories.
ACCEL_DECL void write_config_file(const std::filesystem::path& path, const config_values& values);

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/config_file.ipp"
#endif
