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
inline bool sets_omp_num_threads(int nproc_per_node) {
  const char* threads = std::getenv("OMP_NUM_THREADS");
  return nproc_per_node > 1 && (threads == nullptr || *threads == '\0');
}

/// The variables torchrun sets for worker `local_rank` of a static launch (ROLE_* equal the global values: accel has
/// one role), with ACCEL_RESTART_COUNT, and OMP_NUM_THREADS=1 where `sets_omp_num_threads` says.
inline variable_list worker_variables(const job_placement& job, int local_rank) {
  const int rank = job.node_rank * job.nproc_per_node + local_rank;
  const auto world_size = std::to_string(job.nnodes * job.nproc_per_node);
  const auto node_rank = std::to_string(job.node_rank), restarts = std::to_string(job.restart_count);
  variable_list variables = {{"RANK", std::to_string(rank)},
                             {"WORLD_SIZE", world_size},
                             {"LOCAL_RANK", std::to_string(local_rank)},
                             {"LOCAL_WORLD_SIZE", std::to_string(job.nproc_per_node)},
                             {"GROUP_RANK", node_rank},
                             {"NODE_RANK", node_rank},
                             {"GROUP_WORLD_SIZE", std::to_string(job.nnodes)},
                             {"ROLE_RANK", std::to_string(rank)},
                             {"ROLE_WORLD_SIZE", world_size},
                             {"MASTER_ADDR", job.master_addr},
                             {"MASTER_PORT", std::to_string(job.master_port)},
                             {"TORCHELASTIC_RESTART_COUNT", restarts},
                             {"TORCHELASTIC_MAX_RESTARTS", std::to_string(job.max_restarts)},
                             {"ACCEL_RESTART_COUNT", restarts}};
  if (sets_omp_num_threads(job.nproc_per_node)) variables.emplace_back("OMP_NUM_THREADS", "1");
  return variables;
}

/// A TCP port no one listens on now at `address` (host byte order: INADDR_ANY for the launcher, whose rank 0 may
/// serve other nodes; INADDR_LOOPBACK for a job on this machine). Another program could take it before rank 0 binds
/// it (torchrun has the same race). Throws `launch_error` starting with `who` and ending with `advice`.
inline int pick_free_port(std::uint32_t address, const std::string& who, const std::string& advice) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in bound{};
  bound.sin_family = AF_INET;
  bound.sin_addr.s_addr = htonl(address);
  socklen_t length = sizeof bound;
  const bool picked = fd >= 0 && bind(fd, reinterpret_cast<const sockaddr*>(&bound), sizeof bound) == 0 &&
                      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0;
  const int error = errno;
  if (fd >= 0) close(fd);
  if (!picked) throw launch_error(who + "cannot pick a free port: " + std::strerror(error) + advice);
  return ntohs(bound.sin_port);
}

}  // namespace accel::detail::launching
