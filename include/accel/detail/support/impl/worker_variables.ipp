/// \file
/// What worker_variables.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../worker_variables.hpp"

namespace accel::detail::launching {

bool sets_omp_num_threads(int nproc_per_node) {
  const char* threads = std::getenv("OMP_NUM_THREADS");
  return nproc_per_node > 1 && (threads == nullptr || *threads == '\0');
}

variable_list worker_variables(const job_placement& job, int local_rank) {
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

int pick_free_port(std::uint32_t address, const std::string& who, const std::string& advice) {
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
