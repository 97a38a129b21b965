// Starting and supervising the worker processes of `accel launch` (POSIX only, no LibTorch).
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace accel::cli {

struct worker_spec {
  int rank = 0;                                                // global rank, used in messages and output prefixes
  std::vector<std::pair<std::string, std::string>> variables;  // environment variables set for this worker only
};

struct supervision_options {
  std::vector<std::string> program;  // program and arguments, run with execvp (PATH lookup)
  std::vector<worker_spec> workers;
  bool prefix_output = false;  // pipe each worker's stdout/stderr and prefix every line with "[rank R] "
  std::chrono::milliseconds grace_period{3000};  // from SIGTERM to SIGKILL when stopping the workers
};

// Starts every worker in its own process group and waits for all of them. When one fails or the launcher gets
// SIGINT/SIGTERM/SIGHUP/SIGQUIT, stops the others (the signal, then SIGKILL after the grace period). Returns the
// first failing worker's exit code (128 + signal number for a death by signal), 128 + the signal number when the
// launcher was signalled first, 0 when every worker exited 0, or 1 when a worker could not be started.
int supervise_workers(const supervision_options& options);

}  // namespace accel::cli
