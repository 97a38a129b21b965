/// \file
/// The variables a launched worker gets (torchrun's, with accel's restart count) and the free port its rendezvous
/// may use: one definition for `accel launch` (tools/accel_cli) and `accel::launch_processes`. Plain C++ without
/// LibTorch, since the command-line tool includes it.
// IWYU pragma: private, include <accel/launch_processes.hpp>
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../launch.hpp"

namespace accel::detail::launching {

/// One node's share of a static job and the attempt it runs: what its workers' variables say.
struct job_placement {
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int restart_count = 0;  // 0 on the first attempt, k on the k-th restart
  int max_restarts = 0;
};

using variable_list = std::vector<std::pair<std::string, std::string>>;

/// Whether the workers get OMP_NUM_THREADS=1, as torchrun decides: several workers on a node would each start one
/// OpenMP thread per core, and the user has not chosen a value.
ACCEL_DECL bool sets_omp_num_threads(int nproc_per_node);

/// The variables torchrun sets for worker `local_rank` of a static launch (ROLE_* equal the global values: accel has
/// one role), with ACCEL_RESTART_COUNT, and OMP_NUM_THREADS=1 where `sets_omp_num_threads` says.
ACCEL_DECL variable_list worker_variables(const job_placement& job, int local_rank);

/// A TCP port no one listens on now at `address` (host byte order: INADDR_ANY for the launcher, whose rank 0 may
/// serve other nodes; INADDR_LOOPBACK for a job on this machine). Another program could take it before rank 0 binds
/// it (torchrun has the same race). Throws `launch_error` starting with `who` and ending with `advice`.
ACCEL_DECL int pick_free_port(std::uint32_t address, const std::string& who, const std::string& advice);

}  // namespace accel::detail::launching

#if ACCEL_HEADER_ONLY
#include "impl/worker_variables.ipp"
#endif
