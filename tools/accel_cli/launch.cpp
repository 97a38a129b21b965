// `accel launch`: torchrun's static launcher for accel programs, without Python or LibTorch.
//
// Design. The command line becomes a `launch_options` (parse_launch_options), the options become one
// `worker_spec` per local worker holding the environment variables torchrun would set (worker_specs), and
// supervise_job (supervisor.cpp) runs them, one attempt at a time (supervise_workers):
// - each worker is fork()ed, put in its own process group, given its variables and exec'd with execvp, so the
//   program is found on PATH and a signal sent to the group also reaches the worker's own children;
// - one poll() loop waits for everything: SIGCHLD, SIGINT, SIGTERM, SIGHUP and SIGQUIT arrive as bytes on a
//   self-pipe, and with --prefix_output each worker's stdout and stderr arrive on pipes, copied out line by line
//   as "[rank R] line". Nothing spins: without a deadline poll() sleeps until something happens;
// - the first worker to fail (non-zero exit or death by signal) decides the exit code; the others get SIGTERM and,
//   after --grace_period seconds, SIGKILL. A signal sent to the launcher is passed on the same way;
// - with --max_restarts N, a failed attempt is followed, after --restart_delay seconds, by a new one that starts
//   every local worker again (with --master_port 0 on a fresh port), up to N times, as torchrun's --max_restarts
//   does. Each worker gets ACCEL_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT (0 on the first attempt) and
//   TORCHELASTIC_MAX_RESTARTS. A signal sent to the launcher ends the job without a restart;
// - with --nnodes > 1, the launchers keep each other alive (heartbeat.cpp): one that hears nothing from another node
//   for --heartbeat_timeout seconds (its machine vanished) names it, stops its own workers and exits with 1, instead
//   of leaving them waiting for the collective timeout;
// - with --nnodes > 1 and --max_restarts, the nodes restart together over the same connections, node 0 deciding:
//   a failure on any node stops every node's workers, and node 0 starts the next attempt on every node at once, on a
//   fresh store port (heartbeat.cpp's comment has the protocol). A node lost is never restarted.
// - with --rdzv_backend c10d (torchrun's elastic launch, --nnodes MIN:MAX), the launcher that can listen on
//   --rdzv_endpoint hosts the rendezvous and is node 0; the others join it, and node 0 numbers the nodes of each
//   attempt: a node lost ends the attempt and the job goes on with the others while MIN remain, a node that joins
//   later is admitted at the next restart (heartbeat.cpp).
#include "launch.hpp"

#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "accel/config_file.hpp"
#include "accel/detail/support/worker_variables.hpp"
#include "arguments.hpp"
#include "heartbeat.hpp"
#include "job_secret.hpp"
#include "supervisor.hpp"

namespace accel::cli {
namespace {

constexpr int default_master_port = 29500;
constexpr int most_workers_per_node = 1024;  // a typo such as 10000 would otherwise fork that many processes
constexpr int most_nodes = 65536;
constexpr int most_restarts = 1000;
constexpr double longest_wait_s = 3600;  // --grace_period and --restart_delay

// ---------------------------------------------------------------------------------------------------------------
// Command line

// accelerate's names for torchrun's options.
std::string torchrun_name(const std::string& name) {
  static constexpr std::pair<std::string_view, std::string_view> accelerate_names[] = {
      {"num_processes", "nproc_per_node"}, {"num_machines", "nnodes"},           {"machine_rank", "node_rank"},
      {"main_process_ip", "master_addr"},  {"main_process_port", "master_port"},
  };
  for (const auto& [alias, canonical] : accelerate_names) {
    if (name == alias) return std::string(canonical);
  }
  return name;
}

std::chrono::milliseconds parse_seconds(const option_token& option, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double seconds = text.empty() ? -1 : std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(seconds) || seconds < 0 ||
      seconds > longest_wait_s) {
    throw usage_error(option.spelling + " must be a number of seconds from 0 to " +
                      std::to_string(static_cast<int>(longest_wait_s)) + " (e.g. 3 or 0.5), not '" + text + "'");
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

bool is_switch(const option_token& option) {
  return option.name == "prefix_output" || option.name == "heartbeat_all_interfaces" || option.name == "help" ||
         option.name == "h";
}

// The settings the workers read rather than the launcher: checked as the config file's, passed on as variables.
bool is_run_setting(const option_token& option) {
  return option.name == "mixed_precision" || option.name == "gradient_accumulation_steps" ||
         detail::is_parallelism_key(option.name);
}

// One option of the command line, with its value (none for a switch).
struct given_option {
  option_token token;
  std::string value;
};

// --nnodes K, or MIN:MAX for an elastic job (with a rendezvous).
void apply_nnodes(launch_options& options, const option_token& option, const std::string& value) {
  const std::size_t colon = value.find(':');
  options.nnodes = static_cast<int>(parse_whole_number(option, value.substr(colon == std::string::npos ? 0 : colon + 1),
                                                       1, most_nodes, "nodes, or MIN:MAX for an elastic job"));
  options.min_nnodes.reset();
  if (colon != std::string::npos) {
    options.min_nnodes = static_cast<int>(parse_whole_number(option, value.substr(0, colon), 1, options.nnodes,
                                                             "the fewest nodes of MIN:MAX, at most MAX"));
  }
}

// --rdzv_conf KEY=S[,KEY=S]: torchrun's rendezvous settings that accel's rendezvous has.
void apply_rendezvous_settings(launch_options& options, const option_token& option, const std::string& value) {
  std::size_t start = 0;
  do {
    const std::size_t comma = value.find(',', start);
    const std::string setting = value.substr(start, comma == std::string::npos ? comma : comma - start);
    start = comma == std::string::npos ? value.size() + 1 : comma + 1;
    const std::size_t equals = setting.find('=');
    const std::string key = setting.substr(0, equals);
    if (equals == std::string::npos || (key != "last_call_timeout" && key != "join_timeout"))
      throw usage_error(option.spelling +
                        " takes last_call_timeout=S (seconds to wait for more nodes than the fewest) and "
                        "join_timeout=S (seconds to reach the rendezvous and gather the fewest, default 600), "
                        "comma-separated, not '" +
                        setting + "'");
    (key == "join_timeout" ? options.join_timeout : options.last_call) =
        parse_seconds(option, setting.substr(equals + 1));
  } while (start <= value.size());
}

// torchrun's rendezvous flags: the c10d backend only (a launcher hosts it), or static (none).
void apply_rendezvous_option(launch_options& options, const option_token& option, const std::string& value) {
  if (option.name == "rdzv_backend") {
    if (value != "c10d" && value != "static")
      throw usage_error(option.spelling +
                        " must be c10d (the launcher at --rdzv_endpoint hosts the rendezvous) or "
                        "static (none), not '" +
                        value + "'");
    options.elastic = value == "c10d";
  } else if (option.name == "rdzv_endpoint") {
    const std::size_t colon = value.rfind(':');
    options.rdzv_host = value.substr(0, colon);
    if (colon != std::string::npos)
      options.rdzv_port = static_cast<int>(
          parse_whole_number(option, value.substr(colon + 1), 1, 65535, "the rendezvous port of HOST:PORT"));
    if (options.rdzv_host.empty())
      throw usage_error(option.spelling +
                        " must be HOST:PORT (the host of the rendezvous, reachable from every "
                        "node), not '" +
                        value + "'");
  } else if (option.name == "rdzv_id") {
    if (value.empty() || std::any_of(value.begin(), value.end(), [](char c) { return c <= ' ' || c == 0x7f; }))
      throw usage_error(option.spelling + " must be a name without spaces or control characters, not '" + value + "'");
    options.rdzv_id = value;
  } else if (option.name == "rdzv_conf") {
    apply_rendezvous_settings(options, option, value);
  } else {
    throw usage_error("unknown option '" + option.spelling + "'; 'accel launch --help' lists the options");
  }
}

// Applies one option given on the command line.
void apply_option(launch_options& options, const given_option& given) {
  const option_token& option = given.token;
  const std::string& value = given.value;
  if (is_switch(option)) {
    (option.name == "prefix_output"              ? options.prefix_output
     : option.name == "heartbeat_all_interfaces" ? options.heartbeat_all_interfaces
                                                 : options.show_help) = true;
  } else if (is_run_setting(option)) {
    try {
      set_config_value(options.run, option.name, value, option.spelling);
    } catch (const config_error& e) {
      throw usage_error(e.what());
    }
  } else if (option.name == "config_file") {
    // read before the other options are applied (options_from_config_file)
  } else if (option.name == "nproc_per_node") {
    options.nproc_per_node =
        static_cast<int>(parse_whole_number(option, value, 1, most_workers_per_node, "worker processes on this node"));
  } else if (option.name == "nnodes") {
    apply_nnodes(options, option, value);
  } else if (option.name.starts_with("rdzv_")) {
    apply_rendezvous_option(options, option, value);
  } else if (option.name == "node_rank") {
    options.node_rank = static_cast<int>(
        parse_whole_number(option, value, 0, most_nodes - 1, "this node's index, 0 on the master node"));
  } else if (option.name == "master_addr") {
    if (value.empty()) throw usage_error(option.spelling + " must not be empty; give node 0's host name or IP address");
    options.master_addr = value;
    options.master_addr_given = true;
  } else if (option.name == "master_port") {
    options.master_port =
        static_cast<int>(parse_whole_number(option, value, 0, 65535, "a TCP port; 0 picks a free one"));
  } else if (option.name == "max_restarts") {
    options.max_restarts = static_cast<int>(
        parse_whole_number(option, value, 0, most_restarts, "how many times a failed job is started again"));
  } else if (option.name == "restart_delay") {
    options.restart_delay = parse_seconds(option, value);
  } else if (option.name == "heartbeat_port") {
    options.heartbeat_port = static_cast<int>(
        parse_whole_number(option, value, 1, 65535, "the TCP port on node 0 where the launchers' heartbeats meet"));
  } else if (option.name == "heartbeat_interval") {
    options.heartbeat_interval = parse_seconds(option, value);
  } else if (option.name == "heartbeat_timeout") {
    options.heartbeat_timeout = parse_seconds(option, value);
  } else {
    options.grace_period = parse_seconds(option, value);
  }
}

// Reads one option and its value; `next` is the argument after it, consumed (and `used_next` set) when the option
// takes a value not given with '='.
given_option read_option(const std::string& argument, const std::string* next, bool& used_next) {
  option_token option = split_option(argument);
  option.name = torchrun_name(option.name);
  if (is_switch(option)) {
    if (option.value) throw usage_error(option.spelling + " takes no value; write just " + option.spelling);
    return {option, ""};
  }
  static constexpr std::string_view valued[] = {"nproc_per_node",
                                                "nnodes",
                                                "node_rank",
                                                "master_addr",
                                                "master_port",
                                                "grace_period",
                                                "config_file",
                                                "mixed_precision",
                                                "gradient_accumulation_steps",
                                                "max_restarts",
                                                "restart_delay",
                                                "heartbeat_port",
                                                "heartbeat_interval",
                                                "heartbeat_timeout",
                                                "rdzv_backend",
                                                "rdzv_endpoint",
                                                "rdzv_id",
                                                "rdzv_conf"};
  if (std::find(std::begin(valued), std::end(valued), option.name) == std::end(valued) && !is_run_setting(option)) {
    throw usage_error("unknown option '" + option.spelling +
                      "'; 'accel launch --help' lists the options (an option meant for the program goes after the "
                      "program's name, or after '--')");
  }
  std::string value = option_value(option, next, used_next);
  return {std::move(option), std::move(value)};
}

bool environment_has(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0';
}

// The config file's settings become the defaults the command line overrides: --config_file names it, otherwise
// the default one (ACCEL_CONFIG_FILE, or ~/.config/accel/default_config.yaml when it exists) is read.
void apply_config_file(launch_options& options, const std::vector<given_option>& given) {
  std::optional<std::filesystem::path> path;
  for (const given_option& option : given) {
    if (option.token.name == "config_file") path = option.value;
  }
  if (!path) path = config_file_in_use();
  if (!path) return;
  config_values values;
  try {
    values = read_config_file(*path);
  } catch (const config_error& e) {
    throw usage_error(e.what());
  }
  options.config_file = std::filesystem::absolute(*path);
  if (values.num_machines) options.nnodes = *values.num_machines;
  if (values.machine_rank) options.node_rank = *values.machine_rank;
  if (values.main_process_ip) {
    options.master_addr = *values.main_process_ip;
    options.master_addr_given = true;
  }
  if (values.main_process_port) options.master_port = *values.main_process_port;
  options.job_processes = values.num_processes;  // divided by the node count once the command line is applied
  // A variable already set in the environment wins over the file, as in accel::read_run_config().
  if (!environment_has("ACCELERATE_MIXED_PRECISION")) options.run.mixed_precision = values.mixed_precision;
  if (!environment_has("ACCELERATE_GRADIENT_ACCUMULATION_STEPS"))
    options.run.gradient_accumulation_steps = values.gradient_accumulation_steps;
  for (std::size_t i = 0; i < detail::mesh_size_variables.size(); ++i)
    if (!environment_has(std::string(detail::mesh_size_variables[i].variable).c_str()))
      options.run.parallelism_config[i] = values.parallelism_config[i];
  if (!environment_has(std::string(detail::cp_comm_strategy_variable).c_str()))
    options.run.cp_comm_strategy = values.cp_comm_strategy;
}

// The mesh the workers will build, checked against the job's size before any worker starts: the sizes of
// --parallelism_config_*, of PARALLELISM_CONFIG_*_SIZE and of the config file's parallelism_config block (each
// overriding the next, as for mixed_precision), when any of them is set.
void resolve_mesh(launch_options& options) {
  try {
    if (!has_parallelism_config(options.run) && !parallelism_config_in_environment()) return;
    const mesh_sizes sizes = parallelism_sizes(options.run, mesh_sizes_from_environment());
    validate_mesh(sizes, options.nnodes * options.nproc_per_node);
    options.mesh = sizes;
  } catch (const mesh_error& e) {
    throw usage_error(std::string(e.what()) +
                      " (the sizes come from --parallelism_config_*_size, PARALLELISM_CONFIG_*_SIZE and the config "
                      "file's parallelism_config block, in that order of precedence; the processes from "
                      "--nproc_per_node x --nnodes)");
  }
}

// The config file's num_processes counts the whole job: each node starts its share, unless --nproc_per_node says.
void apply_job_processes(launch_options& options) {
  if (options.nproc_per_node != 0 || !options.job_processes) return;
  const int total = *options.job_processes;
  if (total % options.nnodes != 0 || total / options.nnodes > most_workers_per_node) {
    throw usage_error(options.config_file->string() + ": num_processes " + std::to_string(total) +
                      " (the whole job) does not give each of the " + std::to_string(options.nnodes) +
                      " nodes the same number of processes, at most " + std::to_string(most_workers_per_node) +
                      "; change num_processes, or give --nproc_per_node");
  }
  options.nproc_per_node = total / options.nnodes;
}

std::string seconds_of(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", std::chrono::duration<double>(duration).count());
  return text;
}

// The keep-alive needs a heartbeat due well within the time after which a silent node is lost, and a port.
void check_heartbeat(const launch_options& options) {
  if (options.heartbeat_timeout.count() == 0) return;
  if (options.heartbeat_interval.count() < 10 || options.heartbeat_interval * 2 > options.heartbeat_timeout) {
    throw usage_error("--heartbeat_interval (" + seconds_of(options.heartbeat_interval) +
                      ") must be at least 0.01 s and at most half of --heartbeat_timeout (" +
                      seconds_of(options.heartbeat_timeout) +
                      "), so that a node is not taken for lost after one late heartbeat; e.g. --heartbeat_interval "
                      "5 --heartbeat_timeout 15 (the defaults), or --heartbeat_timeout 0 to turn the keep-alive off");
  }
  if (options.nnodes > 1 && !options.heartbeat_port && options.master_port == 65535) {
    throw usage_error(
        "--master_port 65535 leaves no port for the launchers' heartbeats (--master_port + 1 by default): give "
        "--heartbeat_port, the same on every node");
  }
}

// An elastic job: the rendezvous host is named, the keep-alive on (the nodes agree over it).
void check_elastic(const launch_options& options) {
  if (options.rdzv_host.empty()) {
    throw usage_error(
        "--rdzv_backend c10d needs --rdzv_endpoint HOST:PORT: the address of the node whose launcher "
        "hosts the rendezvous (node 0), the same on every node");
  }
  if (options.heartbeat_timeout.count() == 0) {
    throw usage_error(
        "--rdzv_backend c10d needs the launchers' heartbeat connections, on which the nodes meet: give "
        "--heartbeat_timeout above 0 (default 15)");
  }
  if (options.program.empty()) {
    throw usage_error("no program given: put the program and its arguments after the options");
  }
}

// The checks that involve more than one option.
void check_consistency(const launch_options& options) {
  if (options.nproc_per_node == 0) {
    throw usage_error(
        "--nproc_per_node is required: how many worker processes to start on this node, given "
        "before the program's name, e.g. 'accel launch --nproc_per_node 2 ./train' (or set "
        "num_processes in the config file: 'accel config --num_processes 2')");
  }
  if (options.node_rank >= options.nnodes) {
    throw usage_error("--node_rank " + std::to_string(options.node_rank) + " is out of range for --nnodes " +
                      std::to_string(options.nnodes) + ": give each node a different --node_rank from 0 to " +
                      std::to_string(options.nnodes - 1) + " (0 on the node at --master_addr)");
  }
  if (options.elastic) return check_elastic(options);
  if (options.min_nnodes) {
    throw usage_error("--nnodes " + std::to_string(*options.min_nnodes) + ":" + std::to_string(options.nnodes) +
                      " (an elastic job) needs a rendezvous: add --rdzv_backend c10d --rdzv_endpoint HOST:PORT "
                      "(the same on every node)");
  }
  if (options.nnodes > 1 && !options.master_addr_given) {
    throw usage_error("--nnodes " + std::to_string(options.nnodes) +
                      " needs --master_addr: the workers of every node connect to node 0, so give its host name or "
                      "IP address, the same on every node (e.g. --master_addr 10.0.0.1)");
  }
  if (options.nnodes > 1 && options.master_port == 0) {
    throw usage_error(
        "--master_port 0 (pick a free port) works only with --nnodes 1, since every node must use the "
        "same port; give a fixed port on every node, e.g. --master_port 29500");
  }
  if (options.nnodes > 1 && options.max_restarts > 0 && options.heartbeat_timeout.count() == 0) {
    throw usage_error("--max_restarts with --nnodes " + std::to_string(options.nnodes) +
                      " needs the launchers' heartbeat connections, on which the nodes agree to restart together: give "
                      "--heartbeat_timeout above 0 (default 15), or leave out --max_restarts");
  }
  check_heartbeat(options);
  if (options.program.empty()) {
    throw usage_error(
        "no program given: put the program and its arguments after the options, e.g. 'accel launch "
        "--nproc_per_node 2 ./train --epochs 3'");
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Workers

// What the workers' accel::read_run_config() reads: the settings as Accelerate's variables, and the config file
// the launcher used (so that the workers read the same one).
void append_run_settings(std::vector<std::pair<std::string, std::string>>& variables, const launch_options& options) {
  if (options.run.mixed_precision) variables.emplace_back("ACCELERATE_MIXED_PRECISION", *options.run.mixed_precision);
  if (options.run.gradient_accumulation_steps) {
    variables.emplace_back("ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                           std::to_string(*options.run.gradient_accumulation_steps));
  }
  if (options.run.cp_comm_strategy)
    variables.emplace_back(detail::cp_comm_strategy_variable, *options.run.cp_comm_strategy);
  if (options.config_file) variables.emplace_back("ACCEL_CONFIG_FILE", options.config_file->string());
  if (options.mesh) {  // every size, as accelerate launch sets them, and the flag its Accelerator reads
    variables.emplace_back(detail::use_parallelism_config_variable, "true");
    for (const auto& entry : detail::mesh_size_variables)
      variables.emplace_back(entry.variable, std::to_string((*options.mesh).*entry.size));
  }
}

// Each local worker's variables (accel/detail/support/worker_variables.hpp, as `accel::launch_processes` gives them)
// and the run settings, for the attempt after `restart_count` restarts.
std::vector<worker_spec> worker_specs(const launch_options& options, int master_port, int restart_count,
                                      const std::optional<attempt_verdict>& agreed) {
  const detail::launching::job_placement job{
      .nnodes = agreed && agreed->nnodes ? *agreed->nnodes : options.nnodes,
      .node_rank = agreed && agreed->node_rank ? *agreed->node_rank : options.node_rank,
      .nproc_per_node = options.nproc_per_node,
      .master_addr = options.elastic ? options.rdzv_host : options.master_addr,
      .master_port = master_port,
      .restart_count = restart_count,
      .max_restarts = options.max_restarts};
  std::vector<worker_spec> specs;
  for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
    worker_spec spec;
    spec.rank = job.node_rank * options.nproc_per_node + local_rank;
    spec.variables = detail::launching::worker_variables(job, local_rank);
    if (options.elastic) spec.variables.emplace_back("TORCHELASTIC_RUN_ID", options.rdzv_id);
    append_run_settings(spec.variables, options);
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace

launch_options parse_launch_options(const std::vector<std::string>& args) {
  std::vector<given_option> given;
  std::size_t i = 0;
  while (i < args.size()) {
    const std::string& argument = args[i];
    if (argument == "--") {
      ++i;
      break;
    }
    if (!argument.starts_with("-") || argument == "-") break;  // the program
    const std::string* next = i + 1 < args.size() ? &args[i + 1] : nullptr;
    bool used_next = false;
    given.push_back(read_option(argument, next, used_next));
    i += used_next ? 2 : 1;
  }
  launch_options options;
  for (const given_option& option : given) apply_option(options, option);  // checks every value, finds --help
  if (options.show_help) return options;
  apply_config_file(options, given);  // the file's settings first, then the command line's over them
  for (const given_option& option : given) apply_option(options, option);
  apply_job_processes(options);
  options.program.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  check_consistency(options);
  resolve_mesh(options);
  return options;
}

namespace {

// accel launch --help (a constant, too long for a function).
constexpr const char* launch_usage_text =
    "usage: accel launch --nproc_per_node N [options] [--] program [arguments...]\n"
    "\n"
    "Starts N processes of program on this node, each with torchrun's environment variables, and waits\n"
    "for them. When a worker fails, the others get SIGTERM, then SIGKILL after the grace period, and\n"
    "accel launch exits with the failing worker's exit code (128 + S for a death by signal S), or,\n"
    "with --max_restarts R, starts all N workers again, up to R times.\n"
    "SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to accel launch are passed on to every worker, and no\n"
    "restart follows.\n"
    "\n"
    "options (--name value or --name=value; dashes work as well as underscores):\n"
    "  --nproc_per_node N  worker processes on this node (required, at least 1)\n"
    "  --nnodes K          number of nodes (default 1)\n"
    "  --node_rank I       this node's index, from 0 to K-1 (default 0)\n"
    "  --master_addr A     host name or IP address of node 0 (default 127.0.0.1; required if K > 1)\n"
    "  --master_port P     TCP port on node 0 (default 29500; 0 picks a free port, with one node only)\n"
    "  --prefix_output     prefix every line a worker prints with \"[rank R] \"\n"
    "  --grace_period S    seconds from SIGTERM to SIGKILL when stopping the workers (default 3)\n"
    "  --max_restarts R    after a worker fails, start all the workers again, up to R times (0 to 1000,\n"
    "                      default 0). With K > 1 every node restarts together: a failure on any node\n"
    "                      stops the workers of every node, then node 0 starts the next attempt on\n"
    "                      every node, on a fresh port of its own for the store (not --master_port);\n"
    "                      a node lost (see --heartbeat_timeout) is never restarted (an elastic job,\n"
    "                      below, goes on without it)\n"
    "  --restart_delay S   seconds to wait before each restart (default 1)\n"
    "  --heartbeat_timeout S  with K > 1: a node whose launcher is not heard for S seconds is lost\n"
    "                      (its machine or its link is down): every other node names it (which node,\n"
    "                      its ranks, since when), stops its workers and exits with 1, instead of\n"
    "                      waiting for the collective timeout (default 15; 0 turns the keep-alive off)\n"
    "  --heartbeat_interval S  seconds between two heartbeats (default 5, at most half the timeout)\n"
    "  --heartbeat_port P  the TCP port on node 0 where the launchers' heartbeats meet (default\n"
    "                      --master_port + 1; the same on every node). Node 0 listens there at\n"
    "                      --master_addr only, and acts on nothing a connection says before it proved\n"
    "                      that its launcher holds the job's secret: ACCEL_JOB_SECRET (at least 16\n"
    "                      characters, the same on every node; never printed, nor passed to the\n"
    "                      workers), or without it ~/.config/accel/job_secret (made on first use,\n"
    "                      readable by you alone: the same on machines that share your home directory)\n"
    "  --heartbeat_all_interfaces  node 0 listens on every interface instead of --master_addr's (when\n"
    "                      the others reach it by an address it does not have, behind NAT)\n"
    "  --nnodes MIN:MAX, --rdzv_backend c10d, --rdzv_endpoint HOST:PORT, --rdzv_id ID\n"
    "                      an elastic job (torchrun's flags): the launcher at HOST (which can listen on\n"
    "                      PORT, default 29400) hosts the rendezvous and is node 0; every other launcher\n"
    "                      joins it with the same ID and --nproc_per_node, and node 0 numbers the nodes\n"
    "                      (no --node_rank, --master_addr or --master_port). The job starts on MAX nodes,\n"
    "                      or on MIN or more once no other joined within the last call. A node lost ends\n"
    "                      the attempt; with --max_restarts the job goes on with the others (WORLD_SIZE\n"
    "                      and RANK renumbered) while MIN remain; a node that joins later is admitted at\n"
    "                      the next restart. Workers also get TORCHELASTIC_RUN_ID=ID\n"
    "  --rdzv_conf last_call_timeout=S,join_timeout=S\n"
    "                      seconds to wait for more than MIN nodes (default 30), and for this launcher to\n"
    "                      reach the rendezvous and the rendezvous to gather MIN nodes (default 600,\n"
    "                      torchrun's): past it the launcher says what it waited for and exits with 1\n"
    "  --mixed_precision M no, bf16, fp16 or fp8: sets ACCELERATE_MIXED_PRECISION for the workers\n"
    "  --gradient_accumulation_steps N  sets ACCELERATE_GRADIENT_ACCUMULATION_STEPS for the workers\n"
    "  --parallelism_config_dp_replicate_size N, --parallelism_config_dp_shard_size N,\n"
    "  --parallelism_config_cp_size N, --parallelism_config_tp_size N, --parallelism_config_pp_size N\n"
    "                      the device mesh (Accelerate's ParallelismConfig): checked against the job\n"
    "                      (the sizes must multiply to K*N) before any worker starts, then set as\n"
    "                      PARALLELISM_CONFIG_*_SIZE (all five) and ACCELERATE_USE_PARALLELISM_CONFIG=true\n"
    "  --parallelism_config_cp_comm_strategy S  allgather (default) or alltoall: how context parallelism\n"
    "                      passes keys and values; sets PARALLELISM_CONFIG_CP_COMM_STRATEGY\n"
    "  --config_file F     the config file to read (default: $ACCEL_CONFIG_FILE, or\n"
    "                      ~/.config/accel/default_config.yaml if it exists; see 'accel config')\n"
    "  -h, --help          show this help\n"
    "\n"
    "accelerate's --num_processes, --num_machines, --machine_rank, --main_process_ip and\n"
    "--main_process_port are accepted for the same settings. The config file's settings are the\n"
    "defaults (num_processes there counts the whole job: --nproc_per_node is num_processes /\n"
    "num_machines); the command line overrides them. The workers get ACCEL_CONFIG_FILE naming it.\n"
    "\n"
    "Worker l (0 <= l < N) gets RANK=I*N+l, WORLD_SIZE=K*N, LOCAL_RANK=l, LOCAL_WORLD_SIZE=N,\n"
    "GROUP_RANK=NODE_RANK=I, GROUP_WORLD_SIZE=K, ROLE_RANK=RANK, ROLE_WORLD_SIZE=WORLD_SIZE, MASTER_ADDR,\n"
    "MASTER_PORT, ACCEL_RESTART_COUNT=TORCHELASTIC_RESTART_COUNT=k on the k-th restart (0 at first),\n"
    "TORCHELASTIC_MAX_RESTARTS=R, and OMP_NUM_THREADS=1 when N > 1 and OMP_NUM_THREADS is not set.\n"
    "\n"
    "examples:\n"
    "  accel launch --nproc_per_node 2 ./train --epochs 3\n"
    "  accel launch --nproc_per_node 2 --max_restarts 3 ./train --resume\n"
    "  accel launch --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 --nproc_per_node 4 ./train\n"
    "  accel launch --nnodes 1:2 --rdzv_backend c10d --rdzv_endpoint 10.0.0.1:29400 --rdzv_id run7\n"
    "      --max_restarts 3 --nproc_per_node 4 ./train\n";

}  // namespace

const char* launch_usage() { return launch_usage_text; }

int run_launch(const launch_options& options) {
  // torchrun does the same: N workers each starting one OpenMP thread per core would oversubscribe the cores.
  if (detail::launching::sets_omp_num_threads(options.nproc_per_node)) {
    std::fprintf(stderr,
                 "accel launch: setting OMP_NUM_THREADS=1 for each worker so that %d workers do not overload the "
                 "cores; set OMP_NUM_THREADS yourself to choose another value\n",
                 options.nproc_per_node);
  }
  supervision_options supervision;
  supervision.program = options.program;
  supervision.prefix_output = options.prefix_output;
  supervision.grace_period = options.grace_period;
  supervision.max_restarts = options.max_restarts;
  supervision.restart_delay = options.restart_delay;
  std::unique_ptr<peer_watch> heartbeat;  // with restarts, node 0's decides when each attempt starts
  const bool keep_alive = (options.nnodes > 1 || options.elastic) && options.heartbeat_timeout.count() > 0;
  if (!keep_alive) unsetenv(job_secret_variable);  // the workers never inherit it (load_job_secret removes it too)
  if (keep_alive) {
    heartbeat = make_heartbeat(
        {.nnodes = options.nnodes,
         .node_rank = options.node_rank,
         .nproc_per_node = options.nproc_per_node,
         .master_addr = options.elastic ? options.rdzv_host : options.master_addr,
         .port = options.elastic ? options.rdzv_port : options.heartbeat_port.value_or(options.master_port + 1),
         .all_interfaces = options.heartbeat_all_interfaces,
         .secret = load_job_secret(),
         .interval = options.heartbeat_interval,
         .timeout = options.heartbeat_timeout,
         .max_restarts = options.max_restarts,
         .restart_delay = options.restart_delay,
         .elastic = options.elastic,
         .min_nnodes = options.min_nnodes.value_or(options.nnodes),
         .rdzv_id = options.rdzv_id,
         .last_call = options.last_call,
         .join_timeout = options.join_timeout});
    supervision.peers = heartbeat.get();
  }
  const auto workers = [&](int restart_count, const std::optional<attempt_verdict>& agreed) {
    // A fresh free port per attempt: the previous attempt's may still be held (TIME_WAIT). Across nodes, node 0 picks
    // it and tells the others.
    int master_port = options.master_port;
    if (agreed && agreed->master_port)
      master_port = *agreed->master_port;
    else if (master_port == 0)
      master_port = detail::launching::pick_free_port(INADDR_ANY, "", "; give a port with --master_port");
    return worker_specs(options, master_port, restart_count, agreed);
  };
  const int exit_code = supervise_job(supervision, workers);
  if (heartbeat) heartbeat->finish(exit_code);
  return exit_code;
}

int launch_main(const std::vector<std::string>& args) {
  const launch_options options = parse_launch_options(args);
  if (options.show_help) {
    std::fputs(launch_usage(), stdout);
    return exit_ok;
  }
  return run_launch(options);
}

}  // namespace accel::cli
