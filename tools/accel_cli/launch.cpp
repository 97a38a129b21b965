// `accel launch`: torchrun's static launcher for accel programs, without Python or LibTorch.
//
// Design. The command line becomes a `launch_options` (parse_launch_options), the options become one
// `worker_spec` per local worker holding the environment variables torchrun would set (worker_specs), and
// supervise_workers (supervisor.cpp) runs them:
// - each worker is fork()ed, put in its own process group, given its variables and exec'd with execvp, so the
//   program is found on PATH and a signal sent to the group also reaches the worker's own children;
// - one poll() loop waits for everything: SIGCHLD, SIGINT, SIGTERM, SIGHUP and SIGQUIT arrive as bytes on a
//   self-pipe, and with --prefix_output each worker's stdout and stderr arrive on pipes, copied out line by line
//   as "[rank R] line". Nothing spins: without a deadline poll() sleeps until something happens;
// - the first worker to fail (non-zero exit or death by signal) decides the exit code; the others get SIGTERM and,
//   after --grace_period seconds, SIGKILL. A signal sent to the launcher is passed on the same way.
// Static launch only: no rendezvous, restarts or elasticity (torchrun's --rdzv_* and --max_restarts).
#include "launch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "supervisor.hpp"

namespace accel::cli {
namespace {

constexpr int default_master_port = 29500;
constexpr int most_workers_per_node = 1024;  // a typo such as 10000 would otherwise fork that many processes
constexpr int most_nodes = 65536;
constexpr double longest_grace_period_s = 3600;

// ---------------------------------------------------------------------------------------------------------------
// Command line

// One option as the user spelled it (`--nproc-per-node=2`) and the canonical name it stands for.
struct option_token {
  std::string spelling;              // what the user wrote before any '=', for messages
  std::string name;                  // canonical: nproc_per_node, ...
  std::optional<std::string> value;  // the part after '=', if any
};

// torchrun spells its options with underscores or dashes; accelerate's names for the same settings work too.
std::string canonical_option_name(std::string name) {
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  static constexpr std::pair<std::string_view, std::string_view> accelerate_names[] = {
      {"num_processes", "nproc_per_node"}, {"num_machines", "nnodes"},
      {"machine_rank", "node_rank"},       {"main_process_ip", "master_addr"},
      {"main_process_port", "master_port"},
  };
  for (const auto& [alias, canonical] : accelerate_names) {
    if (name == alias) return std::string(canonical);
  }
  return name;
}

option_token split_option(const std::string& argument) {
  const std::size_t equals = argument.find('=');
  option_token token;
  token.spelling = argument.substr(0, equals);
  if (equals != std::string::npos) token.value = argument.substr(equals + 1);
  const std::size_t dashes = token.spelling.starts_with("--") ? 2 : 1;
  token.name = canonical_option_name(token.spelling.substr(dashes));
  return token;
}

long long parse_whole_number(const option_token& option, const std::string& text, long long low, long long high,
                             std::string_view meaning) {
  long long number = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, number);
  if (text.empty() || error != std::errc{} || stop != end || number < low || number > high) {
    throw usage_error(option.spelling + " must be a whole number from " + std::to_string(low) + " to " +
                      std::to_string(high) + " (" + std::string(meaning) + "), not '" + text + "'");
  }
  return number;
}

std::chrono::milliseconds parse_seconds(const option_token& option, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double seconds = text.empty() ? -1 : std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(seconds) || seconds < 0 ||
      seconds > longest_grace_period_s) {
    throw usage_error(option.spelling + " must be a number of seconds from 0 to " +
                      std::to_string(static_cast<int>(longest_grace_period_s)) + " (e.g. 3 or 0.5), not '" + text +
                      "'");
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

// Applies one option; `next` is the argument after it, consumed (and `used_next` set) when the option takes a
// value not given with '='.
void apply_option(launch_options& options, const option_token& option, const std::string* next, bool& used_next) {
  if (option.name == "prefix_output" || option.name == "help" || option.name == "h") {
    if (option.value) throw usage_error(option.spelling + " takes no value; write just " + option.spelling);
    (option.name == "prefix_output" ? options.prefix_output : options.show_help) = true;
    return;
  }
  static constexpr std::string_view valued[] = {"nproc_per_node", "nnodes",      "node_rank",
                                                "master_addr",    "master_port", "grace_period"};
  if (std::find(std::begin(valued), std::end(valued), option.name) == std::end(valued)) {
    throw usage_error("unknown option '" + option.spelling +
                      "'; 'accel launch --help' lists the options (an option meant for the program goes after the "
                      "program's name, or after '--')");
  }
  std::string value;
  if (option.value) {
    value = *option.value;
  } else if (next != nullptr && !next->starts_with("--")) {
    value = *next;
    used_next = true;
  } else {
    throw usage_error(option.spelling + " needs a value, e.g. " + option.spelling + " 2 or " + option.spelling +
                      "=2");
  }
  if (option.name == "nproc_per_node") {
    options.nproc_per_node = static_cast<int>(
        parse_whole_number(option, value, 1, most_workers_per_node, "worker processes on this node"));
  } else if (option.name == "nnodes") {
    options.nnodes = static_cast<int>(parse_whole_number(option, value, 1, most_nodes, "nodes"));
  } else if (option.name == "node_rank") {
    options.node_rank =
        static_cast<int>(parse_whole_number(option, value, 0, most_nodes - 1, "this node's index, 0 on the master node"));
  } else if (option.name == "master_addr") {
    if (value.empty()) throw usage_error(option.spelling + " must not be empty; give node 0's host name or IP address");
    options.master_addr = value;
    options.master_addr_given = true;
  } else if (option.name == "master_port") {
    options.master_port =
        static_cast<int>(parse_whole_number(option, value, 0, 65535, "a TCP port; 0 picks a free one"));
  } else {
    options.grace_period = parse_seconds(option, value);
  }
}

// The checks that involve more than one option.
void check_consistency(const launch_options& options) {
  if (options.nproc_per_node == 0) {
    throw usage_error("--nproc_per_node is required: how many worker processes to start on this node, given "
                      "before the program's name, e.g. 'accel launch --nproc_per_node 2 ./train'");
  }
  if (options.node_rank >= options.nnodes) {
    throw usage_error("--node_rank " + std::to_string(options.node_rank) + " is out of range for --nnodes " +
                      std::to_string(options.nnodes) + ": give each node a different --node_rank from 0 to " +
                      std::to_string(options.nnodes - 1) + " (0 on the node at --master_addr)");
  }
  if (options.nnodes > 1 && !options.master_addr_given) {
    throw usage_error("--nnodes " + std::to_string(options.nnodes) +
                      " needs --master_addr: the workers of every node connect to node 0, so give its host name or "
                      "IP address, the same on every node (e.g. --master_addr 10.0.0.1)");
  }
  if (options.nnodes > 1 && options.master_port == 0) {
    throw usage_error("--master_port 0 (pick a free port) works only with --nnodes 1, since every node must use the "
                      "same port; give a fixed port on every node, e.g. --master_port 29500");
  }
  if (options.program.empty()) {
    throw usage_error("no program given: put the program and its arguments after the options, e.g. 'accel launch "
                      "--nproc_per_node 2 ./train --epochs 3'");
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Workers

// Binds a TCP socket to port 0 on every address and reads back the port the kernel chose. Another process could
// take it before rank 0 binds it (torchrun has the same race); it is unlikely right after the port was free.
int pick_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("cannot open a socket to pick a free port: ") + std::strerror(errno) +
                                       "; give a port with --master_port");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    close(fd);
    throw std::runtime_error(std::string("cannot pick a free port: ") + std::strerror(error) +
                             "; give a port with --master_port");
  }
  close(fd);
  return ntohs(address.sin_port);
}

// The variables torchrun sets for a static launch (ROLE_* equal the global values: accel has one role).
std::vector<worker_spec> worker_specs(const launch_options& options, int master_port, bool set_omp_num_threads) {
  const int world_size = options.nnodes * options.nproc_per_node;
  std::vector<worker_spec> specs;
  for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
    const int rank = options.node_rank * options.nproc_per_node + local_rank;
    worker_spec spec;
    spec.rank = rank;
    spec.variables = {
        {"RANK", std::to_string(rank)},
        {"WORLD_SIZE", std::to_string(world_size)},
        {"LOCAL_RANK", std::to_string(local_rank)},
        {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
        {"GROUP_RANK", std::to_string(options.node_rank)},
        {"NODE_RANK", std::to_string(options.node_rank)},
        {"GROUP_WORLD_SIZE", std::to_string(options.nnodes)},
        {"ROLE_RANK", std::to_string(rank)},
        {"ROLE_WORLD_SIZE", std::to_string(world_size)},
        {"MASTER_ADDR", options.master_addr},
        {"MASTER_PORT", std::to_string(master_port)},
    };
    if (set_omp_num_threads) spec.variables.emplace_back("OMP_NUM_THREADS", "1");
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace

launch_options parse_launch_options(const std::vector<std::string>& args) {
  launch_options options;
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
    apply_option(options, split_option(argument), next, used_next);
    i += used_next ? 2 : 1;
  }
  options.program.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (!options.show_help) check_consistency(options);
  return options;
}

const char* launch_usage() {
  return "usage: accel launch --nproc_per_node N [options] [--] program [arguments...]\n"
         "\n"
         "Starts N processes of program on this node, each with torchrun's environment variables, and waits\n"
         "for them. When a worker fails, the others get SIGTERM, then SIGKILL after the grace period, and\n"
         "accel launch exits with the failing worker's exit code (128 + S for a death by signal S).\n"
         "SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to accel launch are passed on to every worker.\n"
         "\n"
         "options (--name value or --name=value; dashes work as well as underscores):\n"
         "  --nproc_per_node N  worker processes on this node (required, at least 1)\n"
         "  --nnodes K          number of nodes (default 1)\n"
         "  --node_rank I       this node's index, from 0 to K-1 (default 0)\n"
         "  --master_addr A     host name or IP address of node 0 (default 127.0.0.1; required if K > 1)\n"
         "  --master_port P     TCP port on node 0 (default 29500; 0 picks a free port, with one node only)\n"
         "  --prefix_output     prefix every line a worker prints with \"[rank R] \"\n"
         "  --grace_period S    seconds from SIGTERM to SIGKILL when stopping the workers (default 3)\n"
         "  -h, --help          show this help\n"
         "\n"
         "accelerate's --num_processes, --num_machines, --machine_rank, --main_process_ip and\n"
         "--main_process_port are accepted for the same settings.\n"
         "\n"
         "Worker l (0 <= l < N) gets RANK=I*N+l, WORLD_SIZE=K*N, LOCAL_RANK=l, LOCAL_WORLD_SIZE=N,\n"
         "GROUP_RANK=NODE_RANK=I, GROUP_WORLD_SIZE=K, ROLE_RANK=RANK, ROLE_WORLD_SIZE=WORLD_SIZE, MASTER_ADDR,\n"
         "MASTER_PORT, and OMP_NUM_THREADS=1 when N > 1 and OMP_NUM_THREADS is not set.\n"
         "\n"
         "examples:\n"
         "  accel launch --nproc_per_node 2 ./train --epochs 3\n"
         "  accel launch --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 --nproc_per_node 4 ./train\n";
}

int run_launch(const launch_options& options) {
  const int master_port = options.master_port == 0 ? pick_free_port() : options.master_port;
  // torchrun does the same: N workers each starting one OpenMP thread per core would oversubscribe the cores.
  const bool set_omp_num_threads = options.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr;
  if (set_omp_num_threads) {
    std::fprintf(stderr,
                 "accel launch: setting OMP_NUM_THREADS=1 for each worker so that %d workers do not overload the "
                 "cores; set OMP_NUM_THREADS yourself to choose another value\n",
                 options.nproc_per_node);
  }
  supervision_options supervision;
  supervision.program = options.program;
  supervision.workers = worker_specs(options, master_port, set_omp_num_threads);
  supervision.prefix_output = options.prefix_output;
  supervision.grace_period = options.grace_period;
  return supervise_workers(supervision);
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
