/// \file
/// `accel::launch_processes(function, n)`: Accelerate's `debug_launcher` and `notebook_launcher` for C++. Runs a
/// callable in n fresh processes on this machine, each with the variables `accel launch` sets (RANK, WORLD_SIZE,
/// MASTER_PORT on a free port, ...), and returns in the calling process once all of them returned, or throws
/// `accel::launch_failure` naming the first process that failed and why (its exception's text, its exit status or
/// the signal that killed it), the others stopped at once. So a Catch2 or GoogleTest case tests distributed code by
/// itself, without `accel launch` around the test program.
///
/// The processes are fork()ed from the caller: each starts with a copy of its memory (the callable, its captures,
/// tensors made before), on one thread. LibTorch's intra-op thread pool does not survive fork() (OpenMP's threads
/// are not copied, and a parallel region would wait for them forever), so each process runs LibTorch's kernels on
/// one thread (`at::set_num_threads(1)`), as `accel launch` gives each of several workers OMP_NUM_THREADS=1.
/// CUDA does not survive fork() either: once this process has initialised CUDA, its forked processes cannot use it,
/// so `launch_processes` then refuses to start (as Accelerate's `notebook_launcher` does).
#pragma once

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <concepts>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/config.hpp"
#include "detail/support/worker_variables.hpp"
#include "launch.hpp"

namespace accel {

/// How `launch_processes` runs and bounds a job.
struct process_launch_options {
  /// The longest the whole job may take: past it every process is stopped and `launch_failure` is thrown (a hang
  /// fails instead of blocking the test run).
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// From SIGTERM to SIGKILL when the processes are stopped (as `accel launch --grace_period`).
  std::chrono::milliseconds grace_period = std::chrono::seconds(3);
};

/// A launched job that failed: `process_index` names the first process that failed (its RANK), `reason` says how
/// (its exception's what(), its exit status, the signal that killed it); for a timeout, `timed_out` is true and
/// `process_index` is the first process still running.
struct launch_failure : launch_error {
  ACCEL_DECL launch_failure(const std::string& message, int process, std::string why, bool timeout);
  int process_index;
  std::string reason;
  bool timed_out;
};

namespace detail::launching {

/// Whether this process has initialised CUDA's driver (cuInit). Without libcuda loaded it cannot have; with it, the
/// driver's cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED (3) until cuInit, and nothing here initialises it.
ACCEL_DECL bool cuda_initialized();

/// Refuses a fork that would leave every process without CUDA (cudaErrorInitializationError at its first CUDA call).
ACCEL_DECL void refuse_after_cuda(bool cuda_initialised);

// What a process writes on its pipe before it ends: a kind, then the function's result or the exception's text.
inline constexpr char returned_mark = 'R';
inline constexpr char threw_mark = 'E';

/// Writes all of `text` to `fd` (a pipe: a write may take part of it).
ACCEL_DECL void write_all(int fd, const std::string& text);

/// Gives the process the default reaction to the signals that stop or crash it, unblocked: a test framework's handler
/// copied from the caller (Catch2's, GoogleTest's) would report a failure of the caller's test from the child, and
/// hide the signal from the caller, who names it.
ACCEL_DECL void reset_signals();

/// Runs the function as one process of the job and ends the process: never returns into the caller's code (its
/// test framework, its destructors), which belongs to the parent.
template <class Function>
[[noreturn]] void run_as_process(Function& function, int rank, int world_size, int port, int fd, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // a parent killed outright (a test runner's timeout) takes the job with it
  if (getppid() != parent) _exit(128 + SIGKILL);
  setpgid(0, 0);  // a group of its own: stopping the process reaches whatever it started
  reset_signals();
  std::string message;
  int status = 0;
  try {
    const job_placement job{.nproc_per_node = world_size, .master_port = port};
    for (const auto& [name, value] : worker_variables(job, rank)) setenv(name.c_str(), value.c_str(), 1);
    at::set_num_threads(1);  // the parent's OpenMP threads were not copied (see the file's comment)
    if constexpr (std::is_void_v<std::invoke_result_t<Function&>>) {
      function();
      message = returned_mark;
    } else {
      message = returned_mark + std::string(function());
    }
  } catch (const std::exception& e) {
    message = threw_mark + ("an exception: " + std::string(e.what()));
    status = 1;
  } catch (...) {
    message = threw_mark + std::string("an exception that is not a std::exception");
    status = 1;
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  write_all(fd, message);
  _exit(status);
}

/// A signal's name as the shell writes it, or its number.
ACCEL_DECL std::string signal_name(int signal);

/// One started process, as the parent sees it.
struct launched_process {
  pid_t pid = -1;
  int fd = -1;          // the read end of its pipe, until its end is read
  std::string message;  // what it wrote
  bool reaped = false;
  int status = 0;  // waitpid's
};

/// Why a reaped process failed, or nothing when it returned.
ACCEL_DECL std::string failure_of(const launched_process& process);

/// The parent's side of a job: starts the processes, waits for all of them within the timeout, stops the others when
/// one fails. Its destructor kills and reaps whatever still runs, so that no process outlives the call.
class process_job {
 public:
  process_job(int size, process_launch_options options) : options_(options), processes_(std::size_t(size)) {}
  process_job(const process_job&) = delete;
  process_job& operator=(const process_job&) = delete;
  ACCEL_DECL ~process_job();

  template <class Function>
  void start(Function& function) {
    const int port = pick_free_port(INADDR_LOOPBACK,
                                    "accel::launch_processes: ", " (MASTER_PORT for the processes on this machine)");
    const pid_t parent = getpid();
    std::cout.flush();  // what is buffered now would otherwise be written by every process too
    std::cerr.flush();
    std::fflush(nullptr);
    for (std::size_t rank = 0; rank < processes_.size(); ++rank) {
      int ends[2];
      if (pipe2(ends, O_CLOEXEC) != 0) throw_system_error("cannot make a pipe");
      const pid_t pid = fork();
      if (pid < 0) {
        const int error = errno;
        close(ends[0]);
        close(ends[1]);
        errno = error;
        throw_system_error("cannot fork process " + std::to_string(rank));
      }
      if (pid == 0) {
        for (std::size_t earlier = 0; earlier < rank; ++earlier) close(processes_[earlier].fd);
        close(ends[0]);
        run_as_process(function, static_cast<int>(rank), static_cast<int>(processes_.size()), port, ends[1], parent);
      }
      close(ends[1]);
      fcntl(ends[0], F_SETFL, O_NONBLOCK);
      setpgid(pid, pid);  // the child does it too: whichever runs first, the group exists before it is signalled
      processes_[rank].pid = pid;
      processes_[rank].fd = ends[0];
    }
    deadline_ = std::chrono::steady_clock::now() + options_.timeout;
  }

  /// Waits for every process; returns what each function returned, or throws `launch_failure`.
  ACCEL_DECL std::vector<std::string> wait();

 private:
  using clock = std::chrono::steady_clock;

  [[noreturn]] ACCEL_DECL static void throw_system_error(const std::string& what);

  // Sleeps until a process writes or ends, or for a tenth of a second (a process's end is also seen by waitpid, when
  // a process it started still holds its pipe open).
  ACCEL_DECL void wait_for_news();

  ACCEL_DECL static void read_available(launched_process& process);

  ACCEL_DECL void reap_ended();

  ACCEL_DECL void check_deadlines();

  ACCEL_DECL void begin_stopping();

  ACCEL_DECL void signal_running(int signal);

  [[noreturn]] ACCEL_DECL void throw_failure() const;

  process_launch_options options_;
  std::vector<launched_process> processes_;
  clock::time_point deadline_{};
  clock::time_point kill_at_{};
  bool stopping_ = false;
  bool timed_out_ = false;
  int failed_ = -1;
};

}  // namespace detail::launching

/// Runs `function` in `num_processes` fresh processes of this machine and waits for them (Accelerate's
/// `debug_launcher(function, num_processes)`, `notebook_launcher(function, num_processes=n)`). Each process gets
/// the variables `accel launch` sets (RANK = its index, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR =
/// 127.0.0.1, MASTER_PORT = a free port, the torchrun ones, OMP_NUM_THREADS=1 unless set), so an `accel::accelerator`
/// made inside it joins the job. Returns what each process's `function` returned (anything convertible to
/// std::string: a result to check in the caller), by process index; empty strings for a function returning void.
/// Throws `accel::launch_error` before starting anything once this process has initialised CUDA (see above), and
/// `accel::launch_failure` naming the first process that failed (threw, exited, was killed by a signal) or
/// that still ran when `options.timeout` passed; every other process is stopped (SIGTERM, then SIGKILL after
/// `options.grace_period`) and reaped before it is thrown.
template <class Function>
  requires std::invocable<Function&> && (std::is_void_v<std::invoke_result_t<Function&>> ||
                                         std::convertible_to<std::invoke_result_t<Function&>, std::string>)
std::vector<std::string> launch_processes(Function&& function, int num_processes,
                                          const process_launch_options& options = {}) {
  if (num_processes < 1 || num_processes > 1024)
    throw launch_error("accel::launch_processes: num_processes is " + std::to_string(num_processes) +
                       "; give from 1 to 1024 processes");
  if (options.timeout <= std::chrono::milliseconds::zero() || options.grace_period < std::chrono::milliseconds::zero())
    throw launch_error(
        "accel::launch_processes: process_launch_options::timeout must be positive and grace_period not negative");
  detail::launching::refuse_after_cuda(detail::launching::cuda_initialized());
  detail::launching::process_job job(num_processes, options);
  job.start(function);
  return job.wait();
}

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/launch_processes.ipp"
#endif
