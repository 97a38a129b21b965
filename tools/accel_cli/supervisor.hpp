// Starting and supervising the worker processes of `accel launch` (POSIX only, no LibTorch).
#pragma once

#include <poll.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace accel::cli {

struct worker_spec {
  int rank = 0;                                                // global rank, used in messages and output prefixes
  std::vector<std::pair<std::string, std::string>> variables;  // environment variables set for this worker only
};

// What the nodes of a job agreed after an attempt (peer_watch::verdict): start the next one on `master_port`, or end
// the job with `exit_code`, saying `message` (empty when every worker succeeded).
// An elastic job's verdict also says how many nodes the next attempt has and which of them this one is, and its
// number (a node admitted later joins the job at a later attempt).
struct attempt_verdict {
  std::optional<int> master_port;
  int exit_code = 0;
  std::string message;
  std::optional<int> nnodes;
  std::optional<int> node_rank;
  int attempt = 0;
};

// What can end an attempt besides its workers: the other nodes' launchers, watched through their heartbeats
// (heartbeat.hpp). The supervisor waits on its descriptors and its timer with the workers' in one poll().
class peer_watch {
 public:
  virtual ~peer_watch() = default;
  // The descriptors to wait on, appended to `fds`.
  virtual void add_fds(std::vector<pollfd>& fds) const = 0;
  // When the watch must run again even if none of its descriptors is ready.
  virtual std::chrono::steady_clock::time_point next_wakeup() const = 0;
  // Runs after every wait (its descriptors ready or not). Returns, once, the message naming a node that is lost: the
  // attempt then ends.
  virtual std::optional<std::string> on_wakeup() = 0;
  // The job has ended on this node with `exit_code`: tells the other nodes, so that none takes it for lost.
  virtual void finish(int exit_code) = 0;

  // Restarts agreed across the nodes (--max_restarts with --nnodes > 1; heartbeat.cpp's protocol). A watch that does
  // not coordinate them keeps the defaults: each node's attempts are its own.
  virtual bool coordinates_restarts() const { return false; }
  // A worker of the running attempt failed on this node (`exit_code` as supervise_job returns it; `failure` names the
  // worker and how): the other nodes are told, so that every node restarts together.
  virtual void worker_failed(int /*exit_code*/, const std::string& /*failure*/) {}
  // Returns, once per attempt, why the running attempt must end on every node (a worker of another node failed): the
  // workers are then stopped as for a failing worker of this node.
  virtual std::optional<std::string> take_restart_order() { return std::nullopt; }
  // Every worker of the running attempt has ended on this node (exited, or stopped).
  virtual void attempt_ended() {}
  // What the nodes agreed once every node's workers of the attempt have ended: nothing yet, a next attempt, or the end.
  virtual std::optional<attempt_verdict> verdict() { return std::nullopt; }
  // Whether the first attempt too waits for a verdict (an elastic job's rendezvous: who the nodes are).
  virtual bool starts_after_rendezvous() const { return false; }
};

struct supervision_options {
  std::vector<std::string> program;  // program and arguments, run with execvp (PATH lookup)
  bool prefix_output = false;        // pipe each worker's stdout/stderr and prefix every line with "[rank R] "
  std::chrono::milliseconds grace_period{3000};   // from SIGTERM to SIGKILL when stopping the workers
  int max_restarts = 0;                           // how many times a failed job is started again
  std::chrono::milliseconds restart_delay{1000};  // from the end of a failed attempt to the next one's start
  peer_watch* peers = nullptr;                    // the other nodes' heartbeats, for a job of several nodes
};

// The workers of one attempt: restart_count is 0 for the first, k for the k-th restart; `agreed` is what the nodes
// agreed for an attempt coordinated across nodes (its port, and for an elastic job its nodes), none otherwise.
using workers_for_attempt =
    std::function<std::vector<worker_spec>(int restart_count, const std::optional<attempt_verdict>& agreed)>;

// Runs the job: starts every worker of an attempt in its own process group and waits for all of them. When one fails
// or the launcher gets SIGINT/SIGTERM/SIGHUP/SIGQUIT, stops the others (the signal, then SIGKILL after the grace
// period). A failed attempt is followed by a new one, with every worker started again, up to max_restarts times;
// a signal to the launcher is never followed by a restart. Returns the last attempt's first failing worker's exit
// code (128 + signal number for a death by signal), 128 + the signal number when the launcher was signalled first,
// 0 when every worker of an attempt exited 0, or 1 when a worker could not be started or `peers` found a node lost
// (the workers are then stopped as for a failing worker). When `peers` coordinates restarts, node 0 decides for every
// node whether the job starts again (a worker of any node failed, restarts are left), ends with the first failure
// (none left) or succeeded (every worker of every node exited 0).
int supervise_job(const supervision_options& options, const workers_for_attempt& workers);

}  // namespace accel::cli
