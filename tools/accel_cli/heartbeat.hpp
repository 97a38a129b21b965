// The keep-alive between the launchers of a job of several nodes, as torchrun's rendezvous keep-alive: a node whose
// machine vanishes (power lost, link down: no connection is closed) is named within --heartbeat_timeout seconds,
// not after the workers' collective timeout. See the comment at the top of heartbeat.cpp for the design.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "supervisor.hpp"

namespace accel::cli {

struct heartbeat_options {
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  std::string master_addr;                   // node 0's host name or address: the other launchers connect to it
  int port = 0;                              // where node 0's launcher listens
  bool all_interfaces = false;               // node 0 listens on every interface, not only at master_addr
  std::string secret;                        // the job's (load_job_secret()): never sent, never printed
  std::chrono::milliseconds interval{5000};  // between two heartbeats
  std::chrono::milliseconds timeout{15000};  // a node silent this long is lost
  // Above 0: the nodes restart the job together, node 0 deciding (heartbeat.cpp), up to this many times.
  int max_restarts = 0;
  std::chrono::milliseconds restart_delay{1000};  // from the end of a failed attempt on every node to the next
  // Elastic membership (--nnodes MIN:MAX, --rdzv_backend c10d): node 0 hosts the rendezvous at master_addr:port, the
  // others join it with rdzv_id and get their node ranks from it for each attempt; nnodes is the most nodes. A node
  // lost ends the attempt, and the job goes on with the others while min_nnodes remain and restarts are left.
  bool elastic = false;
  int min_nnodes = 1;
  std::string rdzv_id;
  std::chrono::milliseconds last_call{30000};  // waiting for more than min_nnodes at the first attempt
  // The first rendezvous: a launcher that has not reached the host within it, or a host that has not gathered
  // min_nnodes, gives up (torchrun's join_timeout).
  std::chrono::milliseconds join_timeout{600000};
};

// Node 0's launcher listens on `port` at master_addr (throws std::runtime_error naming the port and the fix when it
// cannot); every other node's launcher connects to it and proves that it holds `secret` before anything it says
// counts. The watch is then given to supervise_job (supervision_options::peers). In an
// elastic job, node 0 is the launcher that can listen on master_addr:port (the rendezvous endpoint), as torchrun's
// c10d rendezvous host is the one whose address the endpoint names.
std::unique_ptr<peer_watch> make_heartbeat(const heartbeat_options& options);

// Whether a peer last heard at `last_heard` is silent beyond `timeout` at `now`: the keep-alive's one judgement.
inline bool heartbeat_stale(std::chrono::steady_clock::time_point last_heard, std::chrono::steady_clock::time_point now,
                            std::chrono::milliseconds timeout) {
  return now - last_heard >= timeout;
}

}  // namespace accel::cli
