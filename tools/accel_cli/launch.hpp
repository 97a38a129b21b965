// `accel launch`: starts one training process per local worker with torchrun's environment variables and
// supervises them. See the comment at the top of launch.cpp for the design.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "accel/config_file.hpp"
#include "command.hpp"

namespace accel::cli {

struct launch_options {
  int nproc_per_node = 0;  // required
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  bool master_addr_given = false;
  int master_port = 29500;  // 0: pick a free port (single node only)
  bool prefix_output = false;
  std::chrono::milliseconds grace_period{3000};
  int max_restarts = 0;                           // how many times a failed job is started again (0 to 1000)
  std::chrono::milliseconds restart_delay{1000};  // the wait before each restart
  // The launchers' keep-alive with --nnodes > 1 (heartbeat.hpp): node 0 listens on heartbeat_port (default
  // master_port + 1); a node silent for heartbeat_timeout (0: no keep-alive) is lost.
  std::optional<int> heartbeat_port;
  std::chrono::milliseconds heartbeat_interval{5000};
  std::chrono::milliseconds heartbeat_timeout{15000};
  bool heartbeat_all_interfaces = false;  // node 0 listens on every interface, not only at master_addr
  // Elastic membership (torchrun's --rdzv_backend c10d with --nnodes MIN:MAX): the launcher at rdzv_host:rdzv_port
  // hosts the rendezvous and is node 0; the others join it and get their node ranks from it, attempt by attempt.
  bool elastic = false;
  std::optional<int> min_nnodes;  // --nnodes MIN:MAX: the fewest nodes the job runs on (nnodes is the most)
  std::string rdzv_host;
  int rdzv_port = 29400;  // torchrun's default
  std::string rdzv_id = "none";
  std::chrono::milliseconds last_call{30000};      // --rdzv_conf last_call_timeout: waiting for more than MIN nodes
  std::chrono::milliseconds join_timeout{600000};  // --rdzv_conf join_timeout: the first rendezvous, at most
  std::optional<int> job_processes;                // the config file's num_processes: the whole job, over every node
  config_values run;  // mixed_precision, gradient_accumulation_steps, the mesh sizes: passed on to the workers
  std::optional<mesh_sizes> mesh;  // the sizes in force (flags, file, environment), validated, when any is set
  std::optional<std::filesystem::path> config_file;  // the config file read, if any (passed on to the workers)
  std::vector<std::string> program;                  // the program and its arguments
  bool show_help = false;                            // -h or --help: print the usage, start nothing
};

// Parses the arguments after `launch`. Throws usage_error naming the flag at fault and how to fix it.
launch_options parse_launch_options(const std::vector<std::string>& args);

// The usage text of `accel launch --help`.
const char* launch_usage();

// Starts the workers and waits for them; returns the launcher's exit code.
int run_launch(const launch_options& options);

// The entry point main() dispatches to.
int launch_main(const std::vector<std::string>& args);

inline constexpr command launch_command{
    "launch", "start N worker processes of a program with torchrun's environment variables, and supervise them",
    "accel launch --nproc_per_node N [options] [--] program [arguments...]", launch_main};

}  // namespace accel::cli
