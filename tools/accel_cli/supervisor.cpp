// Starting and supervising the workers of `accel launch`; launch.cpp explains the design.
#include "supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <accel/detail/comm/flight_recorder.hpp>
#include <accel/detail/comm/flight_trace.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace accel::cli {
namespace {

using steady_clock = std::chrono::steady_clock;

// The signals the launcher passes on to its workers, as torchrun does.
constexpr std::array forwarded_signals{SIGINT, SIGTERM, SIGHUP, SIGQUIT};

std::string sigabbrev(int signal_number) {
  switch (signal_number) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGQUIT:
      return "SIGQUIT";
    default:
      return "signal " + std::to_string(signal_number);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Signals become bytes on a pipe (the self-pipe trick): the main loop then waits for worker exits (SIGCHLD), the
// user's Ctrl-C and worker output with one poll(), and no real work runs inside a signal handler.

int signal_pipe_write_end = -1;

// A signal as the pipe carries it. `sender` is the child whose exit raised SIGCHLD: when several workers die at
// once (one killed, the others failing in a collective because of it), the pending SIGCHLD keeps the first one's
// pid (a standard signal is not queued twice), so the launcher names the worker that failed first, not the one
// waitpid() happens to return first.
struct received_signal {
  int number;
  pid_t sender;
};

void record_signal(int signal_number, siginfo_t* info, void*) {
  const int saved_errno = errno;
  const received_signal record{signal_number, signal_number == SIGCHLD && info != nullptr ? info->si_pid : 0};
  // One write of a few bytes is atomic on a pipe; a full pipe drops the record (the loop reaps every exit anyway).
  [[maybe_unused]] const ssize_t ignored = write(signal_pipe_write_end, &record, sizeof record);
  errno = saved_errno;
}

class signal_pipe {
 public:
  signal_pipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
    read_end_ = fds[0];
    write_end_ = fds[1];
    signal_pipe_write_end = write_end_;
    sigemptyset(&handled_);
    install(SIGCHLD, SA_NOCLDSTOP);
    for (const int signal_number : forwarded_signals) install(signal_number, 0);
    // A closed stdout (`accel launch ... | head`) must not kill the launcher and orphan the workers; the write
    // fails with EPIPE instead.
    install(SIGPIPE, 0, /*ignore=*/true);
  }

  signal_pipe(const signal_pipe&) = delete;
  signal_pipe& operator=(const signal_pipe&) = delete;

  ~signal_pipe() {
    restore_dispositions();
    signal_pipe_write_end = -1;
    close(read_end_);
    close(write_end_);
  }

  int read_end() const { return read_end_; }

  // Sleeps for `delay` unless the launcher gets SIGINT, SIGTERM, SIGHUP or SIGQUIT first (or got one since the last
  // take_signals()): returns that signal.
  std::optional<int> sleep_unless_signalled(std::chrono::milliseconds delay) {
    const auto deadline = steady_clock::now() + delay;
    for (;;) {
      for (const received_signal& s : take_signals()) {
        if (s.number != SIGCHLD) return s.number;
      }
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - steady_clock::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd readable{read_end_, POLLIN, 0};
      poll(&readable, 1, static_cast<int>(std::min<long long>(left, 60'000)));
    }
  }

  // The signals received since the last call, in order (SIGCHLD included).
  std::vector<received_signal> take_signals() {
    std::vector<received_signal> signals;
    received_signal buffer[16];
    for (;;) {
      const ssize_t n = read(read_end_, buffer, sizeof buffer);  // whole records: each was written at once
      if (n > 0) {
        signals.insert(signals.end(), buffer, buffer + n / static_cast<ssize_t>(sizeof(received_signal)));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        return signals;
      }
    }
  }

  // While workers are forked, the handled signals are blocked, so that a child never runs the launcher's handler
  // (which would write into the launcher's pipe) before it has reset its signal dispositions.
  void block() { sigprocmask(SIG_BLOCK, &handled_, &mask_before_block_); }
  void unblock() { sigprocmask(SIG_SETMASK, &mask_before_block_, nullptr); }

  // In a forked child before exec: the dispositions and mask the launcher itself started with, so a worker sees
  // what it would see without the launcher (for example SIGHUP still ignored under nohup).
  void reset_in_child() {
    restore_dispositions();
    unblock();
  }

 private:
  struct saved_disposition {
    int signal_number;
    struct sigaction action;
  };

  // Records `signal_number` on the pipe, or with `ignore`, ignores it.
  void install(int signal_number, int flags, bool ignore = false) {
    struct sigaction previous{};
    sigaction(signal_number, nullptr, &previous);
    // A signal the launcher was started with ignored (SIGHUP under nohup, SIGINT in a background job) stays
    // ignored, for the launcher and its workers.
    if (previous.sa_handler == SIG_IGN && !ignore) return;
    struct sigaction action{};
    if (ignore)
      action.sa_handler = SIG_IGN;
    else
      action.sa_sigaction = record_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = flags | SA_RESTART | (ignore ? 0 : SA_SIGINFO);
    sigaction(signal_number, &action, nullptr);
    saved_.push_back({signal_number, previous});
    if (!ignore) sigaddset(&handled_, signal_number);
  }

  void restore_dispositions() {
    for (const saved_disposition& saved : saved_) sigaction(saved.signal_number, &saved.action, nullptr);
  }

  int read_end_ = -1;
  int write_end_ = -1;
  sigset_t handled_{};
  sigset_t mask_before_block_{};
  std::vector<saved_disposition> saved_;
};

// ---------------------------------------------------------------------------------------------------------------
// Prefixed output: a worker's stdout or stderr arrives on a pipe and leaves, line by line, on the launcher's.

// A line longer than this is written in pieces, so a worker that never prints '\n' (a progress bar redrawn with
// '\r') cannot make the launcher's memory grow without bound.
constexpr std::size_t longest_line = 64 * 1024;

// Writes everything, or gives up silently when the destination is gone (EPIPE): the workers' pipes must keep
// being read so that the workers never block on a full pipe.
void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd writable{fd, POLLOUT, 0};  // an inherited non-blocking stdout
      poll(&writable, 1, 100);
    } else {
      return;
    }
  }
}

struct output_stream {
  int fd = -1;           // read end of the worker's pipe; -1 when closed
  int destination = -1;  // the launcher's stdout or stderr
  std::string pending;   // what follows the last '\n' seen
};

// Appends a chunk and writes each complete line with its prefix, in one write() so lines of different workers do
// not interleave mid-line.
void forward_lines(output_stream& stream, std::string_view prefix, std::string_view chunk) {
  stream.pending.append(chunk);
  std::string lines;
  std::size_t start = 0;
  for (std::size_t newline; (newline = stream.pending.find('\n', start)) != std::string::npos; start = newline + 1) {
    lines.append(prefix).append(stream.pending, start, newline + 1 - start);
  }
  stream.pending.erase(0, start);
  if (stream.pending.size() >= longest_line) {
    lines.append(prefix).append(stream.pending).append("\n");
    stream.pending.clear();
  }
  if (!lines.empty()) write_all(stream.destination, lines);
}

// At end of file a partial last line is written too, ended with '\n' so the next prefixed line starts cleanly.
void close_stream(output_stream& stream, std::string_view prefix) {
  if (!stream.pending.empty()) {
    write_all(stream.destination, std::string(prefix).append(stream.pending).append("\n"));
    stream.pending.clear();
  }
  close(stream.fd);
  stream.fd = -1;
}

// Reads once (poll() said there is something): forwards the lines, or closes the stream at end of file.
void read_stream(output_stream& stream, std::string_view prefix) {
  char buffer[16 * 1024];
  ssize_t n;
  do {
    n = read(stream.fd, buffer, sizeof buffer);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    forward_lines(stream, prefix, {buffer, static_cast<std::size_t>(n)});
  } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
    close_stream(stream, prefix);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Workers

struct worker {
  const worker_spec* spec = nullptr;
  pid_t pid = -1;  // also its process group id
  bool running = false;
  std::string prefix;  // "[rank R] "
  output_stream out;
  output_stream err;
};

// The exit code a shell would report: the status, or 128 + the signal number.
int exit_code_of(int wait_status) {
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return WEXITSTATUS(wait_status);
}

std::string describe_exit(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const int signal_number = WTERMSIG(wait_status);
    return "was killed by signal " + std::to_string(signal_number) + " (" + strsignal(signal_number) + ")";
  }
  std::string description = "exited with code " + std::to_string(WEXITSTATUS(wait_status));
  if (WEXITSTATUS(wait_status) == 127) description += " (127: the program could not be run, see above)";
  if (WEXITSTATUS(wait_status) == detail::hang_exit_status)
    description += " (" + std::to_string(detail::hang_exit_status) +
                   ": its hang watch found a collective that did not complete in time)";
  return description;
}

// After a worker failed: the verdict of the flight records in ACCEL_FLIGHT_RECORDER_DIR (the workers' hang watch
// has every process dump before ending its own), naming the process missing from a collective and the collective.
void report_flight_records() {
  const auto directory = detail::flight_record_directory();
  if (!directory) return;
  try {
    const auto traces = detail::read_trace_directory(*directory);
    if (traces.empty()) return;
    const auto verdict = detail::analyse_traces(traces);
    std::string message;
    for (const auto& problem : verdict.problems) message += "accel launch: flight records: " + problem + "\n";
    if (message.empty()) message = "accel launch: flight records in " + *directory + " show no missing process\n";
    std::fprintf(stderr, "%s", message.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel launch: the flight records in %s cannot be read: %s\n", directory->c_str(), e.what());
  }
}

std::string count_workers(std::size_t count, std::string_view adjective) {
  return std::to_string(count) + std::string(adjective) + (count == 1 ? " worker" : " workers");
}

void make_pipe(int (&fds)[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
}

// How one attempt ended.
struct attempt_result {
  int exit_code = 0;                   // as supervise_job() returns it
  std::optional<int> launcher_signal;  // the first SIGINT/SIGTERM/SIGHUP/SIGQUIT sent to the launcher: no restart
  std::string failure;                 // the first failing worker and how, e.g. "worker rank 1 (pid 42) exited ..."
  bool peer_lost = false;              // another node was lost (heartbeat.hpp): no restart
};

// Supervises one attempt: its workers, from their start to the last one's exit.
class supervisor {
 public:
  supervisor(const supervision_options& options, const std::vector<worker_spec>& specs, signal_pipe& signals)
      : options_(options), signals_(signals) {
    for (const std::string& argument : options_.program) argv_.push_back(const_cast<char*>(argument.c_str()));
    argv_.push_back(nullptr);
    workers_.resize(specs.size());
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      workers_[i].spec = &specs[i];
      workers_[i].prefix = "[rank " + std::to_string(specs[i].rank) + "] ";
    }
  }

  attempt_result run() {
    start_workers();
    while (any_running()) {
      wait_for_events(poll_timeout_ms());
      reap_exited_workers();
      watch_peers();
      enforce_deadline();
    }
    drain_output();
    if (!failure_.empty() && !launcher_signal_) report_flight_records();
    return {exit_code_.value_or(0), launcher_signal_, failure_, peer_lost_};
  }

 private:
  // ---- starting

  void start_workers() {
    std::fflush(nullptr);  // nothing buffered may be written twice, by the launcher and by a child
    signals_.block();
    for (worker& w : workers_) {
      try {
        start_worker(w);
      } catch (const std::system_error& e) {
        std::fprintf(stderr,
                     "accel launch: cannot start worker rank %d: %s (the machine may be out of processes or file "
                     "descriptors; try a smaller --nproc_per_node)\n",
                     w.spec->rank, e.what());
        exit_code_ = 1;
        failure_ = "worker rank " + std::to_string(w.spec->rank) + " could not be started";
        begin_stopping(SIGTERM);
        break;
      }
    }
    signals_.unblock();
  }

  void start_worker(worker& w) {
    int out_pipe[2] = {-1, -1};
    int err_pipe[2] = {-1, -1};
    if (options_.prefix_output) {
      make_pipe(out_pipe);
      try {
        make_pipe(err_pipe);
      } catch (...) {
        close(out_pipe[0]);
        close(out_pipe[1]);
        throw;
      }
    }
    const pid_t pid = fork();
    if (pid == 0) exec_worker(*w.spec, out_pipe[1], err_pipe[1]);
    const int fork_errno = errno;
    for (const int fd : {out_pipe[1], err_pipe[1]}) {
      if (fd >= 0) close(fd);
    }
    if (pid < 0) {
      for (const int fd : {out_pipe[0], err_pipe[0]}) {
        if (fd >= 0) close(fd);
      }
      throw std::system_error(fork_errno, std::generic_category(), "fork");
    }
    // The child calls setpgid too; whichever runs first wins, so the group exists before the launcher signals it.
    setpgid(pid, pid);
    w.pid = pid;
    w.running = true;
    w.out = {out_pipe[0], STDOUT_FILENO, {}};
    w.err = {err_pipe[0], STDERR_FILENO, {}};
    for (const int fd : {w.out.fd, w.err.fd}) {
      if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
  }

  // In the child: its own process group (so a signal to the group reaches the worker's own children too), the
  // launcher's original signal handling, the pipes as stdout/stderr, the worker's variables, then the program.
  [[noreturn]] void exec_worker(const worker_spec& spec, int out_fd, int err_fd) {
    setpgid(0, 0);
#ifdef __linux__
    // A launcher killed outright (SIGKILL, OOM killer) cannot stop its workers: have the kernel do it, so none is
    // left waiting in a collective for peers that are gone.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher_pid_) _exit(128 + SIGKILL);  // the launcher died before prctl took effect
#endif
    signals_.reset_in_child();
    if (out_fd >= 0) {
      dup2(out_fd, STDOUT_FILENO);  // the originals are close-on-exec
      dup2(err_fd, STDERR_FILENO);
    }
    for (const auto& [name, value] : spec.variables) setenv(name.c_str(), value.c_str(), 1);
    execvp(argv_[0], argv_.data());
    const int exec_errno = errno;
    if (std::strchr(argv_[0], '/') != nullptr) {
      std::fprintf(stderr, "accel launch: cannot run '%s': %s (check that the file exists and is executable)\n",
                   argv_[0], std::strerror(exec_errno));
    } else {
      std::fprintf(stderr,
                   "accel launch: cannot run '%s': %s (check the name, that its directory is on PATH, or give its "
                   "path, e.g. ./%s)\n",
                   argv_[0], std::strerror(exec_errno), argv_[0]);
    }
    _exit(127);
  }

  // ---- waiting

  bool any_running() const {
    return std::any_of(workers_.begin(), workers_.end(), [](const worker& w) { return w.running; });
  }

  std::size_t count_running() const {
    return static_cast<std::size_t>(
        std::count_if(workers_.begin(), workers_.end(), [](const worker& w) { return w.running; }));
  }

  // Without a deadline the loop sleeps until a signal or output arrives; while stopping, until the deadline; with
  // peers to watch, at most until their next heartbeat is due.
  int poll_timeout_ms() const {
    std::optional<steady_clock::time_point> wake;
    if (stopping_ && !killed_) wake = deadline_;
    if (options_.peers != nullptr)
      wake = std::min(wake.value_or(steady_clock::time_point::max()), options_.peers->next_wakeup());
    if (!wake) return -1;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(*wake - steady_clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, 60'000));
  }

  // The signal pipe and the workers' output, then the peers' descriptors when `with_peers`.
  std::vector<pollfd> poll_set(bool with_peers) const {
    std::vector<pollfd> fds{{signals_.read_end(), POLLIN, 0}};
    for (const worker& w : workers_) {
      for (const output_stream* stream : {&w.out, &w.err}) {
        if (stream->fd >= 0) fds.push_back({stream->fd, POLLIN, 0});
      }
    }
    if (with_peers && options_.peers != nullptr) options_.peers->add_fds(fds);
    return fds;
  }

  // Returns false when the timeout expired with nothing to do. The peers' descriptors are waited on only while
  // workers run; watch_peers() reads them.
  bool wait_for_events(int timeout_ms, bool with_peers = true) {
    std::vector<pollfd> fds = poll_set(with_peers);
    const int ready = poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0) return true;  // EINTR: the handler's byte is read on the next call
    if (ready == 0) return false;
    if (fds[0].revents != 0) {
      for (const received_signal& s : signals_.take_signals()) {
        if (s.number != SIGCHLD)
          on_launcher_signal(s.number);
        else if (s.sender > 0)
          exited_first_.push_back(s.sender);
      }
    }
    for (const pollfd& fd : fds) {
      if (fd.revents != 0 && fd.fd != signals_.read_end()) read_ready_stream(fd.fd);
    }
    return true;
  }

  void read_ready_stream(int fd) {
    for (worker& w : workers_) {
      for (output_stream* stream : {&w.out, &w.err}) {
        if (stream->fd == fd) return read_stream(*stream, w.prefix);
      }
    }
  }

  // The workers SIGCHLD named first, in that order (the first failure is the one reported), then any other.
  void reap_exited_workers() {
    int status = 0;
    const auto reap = [&](pid_t pid) {
      const auto w = std::find_if(workers_.begin(), workers_.end(), [pid](const worker& x) { return x.pid == pid; });
      if (w != workers_.end()) on_worker_exit(*w, status);
    };
    for (const pid_t named : std::exchange(exited_first_, {}))
      if (waitpid(named, &status, WNOHANG) == named) reap(named);
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) reap(pid);
  }

  void on_worker_exit(worker& w, int status) {
    w.running = false;
    const int code = exit_code_of(status);
    if (code == 0 || stopping_) return;  // while stopping, exits are what the launcher asked for
    exit_code_ = code;
    failure_ =
        "worker rank " + std::to_string(w.spec->rank) + " (pid " + std::to_string(w.pid) + ") " + describe_exit(status);
    if (options_.peers != nullptr) options_.peers->worker_failed(code, failure_);
    const std::size_t others = count_running();
    std::string message = "accel launch: " + failure_;
    if (others == 1) message += "; terminating the other worker";
    if (others > 1) message += "; terminating the other " + std::to_string(others) + " workers";
    std::fprintf(stderr, "%s\n", message.c_str());
    begin_stopping(SIGTERM);
  }

  // SIGINT, SIGTERM, SIGHUP or SIGQUIT sent to the launcher goes to every worker; a second one while the workers
  // are stopping kills them at once (an impatient second Ctrl-C). Whenever it comes, the job is not restarted.
  void on_launcher_signal(int signal_number) {
    if (!launcher_signal_) launcher_signal_ = signal_number;
    if (!any_running()) return;  // only output is left to copy
    if (!stopping_) {
      if (!exit_code_) exit_code_ = 128 + signal_number;
      std::fprintf(stderr, "accel launch: received %s; passing it on to the %s\n", sigabbrev(signal_number).c_str(),
                   count_workers(count_running(), " running").c_str());
      begin_stopping(signal_number);
    } else if (!killed_) {
      std::fprintf(stderr, "accel launch: received %s while the workers are stopping; killing them now\n",
                   sigabbrev(signal_number).c_str());
      kill_remaining();
    }
  }

  // The heartbeats are sent and checked while the workers run and while they stop (so that the other nodes do not
  // take this one for lost meanwhile); a node found lost stops the workers as a failing worker does.
  void watch_peers() {
    if (options_.peers == nullptr) return;
    if (const std::optional<std::string> lost = options_.peers->on_wakeup()) return on_peer_lost(*lost);
    if (const std::optional<std::string> order = options_.peers->take_restart_order(); order && !stopping_) {
      failure_ = *order;
      exit_code_ = 1;
      std::fprintf(stderr, "accel launch: %s; stopping this node's %s\n", order->c_str(),
                   count_workers(count_running(), " running").c_str());
      begin_stopping(SIGTERM);
    }
  }

  // A node lost ends the job, never followed by a restart (the job's nodes are fixed): found while the workers stop
  // already (a failure or a restart), it is still what the launcher reports.
  void on_peer_lost(const std::string& lost) {
    peer_lost_ = true;
    exit_code_ = 1;
    failure_ = lost;
    if (stopping_) {
      std::fprintf(stderr, "accel launch: %s\n", lost.c_str());
      return;
    }
    std::string ranks;
    for (const worker& w : workers_) {
      if (w.running) ranks += (ranks.empty() ? "" : ", ") + std::to_string(w.spec->rank);
    }
    std::string message = "accel launch: " + failure_ + "\naccel launch: terminating this node's " +
                          count_workers(count_running(), " running");
    if (!ranks.empty()) message += (count_running() == 1 ? " (rank " : " (ranks ") + ranks + ")";
    std::fprintf(stderr, "%s and exiting with 1\n", message.c_str());
    begin_stopping(SIGTERM);
  }

  // ---- stopping

  void begin_stopping(int signal_number) {
    stopping_ = true;
    deadline_ = steady_clock::now() + options_.grace_period;
    signal_running_groups(signal_number);
  }

  void enforce_deadline() {
    if (!stopping_ || killed_ || !any_running() || steady_clock::now() < deadline_) return;
    const auto grace = std::chrono::duration<double>(options_.grace_period).count();
    std::fprintf(stderr, "accel launch: %s still running %g s after being asked to stop; sending SIGKILL\n",
                 count_workers(count_running(), "").c_str(), grace);
    kill_remaining();
  }

  void kill_remaining() {
    killed_ = true;
    signal_running_groups(SIGKILL);
  }

  // Only the groups of workers not yet reaped: their ids cannot have been reused by an unrelated process.
  void signal_running_groups(int signal_number) {
    for (const worker& w : workers_) {
      if (w.running) kill(-w.pid, signal_number);
    }
  }

  // ---- after the workers

  // What the workers wrote before exiting is still in the pipes. A pipe also held open by a worker's leftover
  // child may never reach end of file, so draining stops after a quiet 100 ms or at most 2 s.
  void drain_output() {
    const auto give_up = steady_clock::now() + std::chrono::seconds(2);
    while (steady_clock::now() < give_up && poll_set(false).size() > 1) {
      if (!wait_for_events(100, /*with_peers=*/false)) break;
    }
    for (worker& w : workers_) {
      for (output_stream* stream : {&w.out, &w.err}) {
        if (stream->fd >= 0) close_stream(*stream, w.prefix);
      }
    }
  }

  const supervision_options& options_;
  signal_pipe& signals_;
  std::vector<char*> argv_;
  std::vector<worker> workers_;
  std::optional<int> exit_code_;
  std::optional<int> launcher_signal_;
  std::string failure_;
  std::vector<pid_t> exited_first_;  // workers in the order SIGCHLD named them, not yet reaped
  pid_t launcher_pid_ = getpid();
  bool stopping_ = false;
  bool killed_ = false;
  bool peer_lost_ = false;
  steady_clock::time_point deadline_{};
};

// ---------------------------------------------------------------------------------------------------------------
// Attempts

// Runs one attempt of the job and waits for it to end.
attempt_result supervise_workers(const supervision_options& options, const std::vector<worker_spec>& workers,
                                 signal_pipe& signals) {
  return supervisor(options, workers, signals).run();
}

void announce_restart(const attempt_result& result, int restart, const supervision_options& options) {
  std::string delay;
  if (options.restart_delay.count() > 0) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, " in %g s", std::chrono::duration<double>(options.restart_delay).count());
    delay = seconds;
  }
  std::fprintf(stderr, "accel launch: %s; restarting the job%s (restart %d of %d)\n", result.failure.c_str(),
               delay.c_str(), restart, options.max_restarts);
}

void announce_giving_up(const attempt_result& result, const supervision_options& options) {
  std::fprintf(stderr, "accel launch: %s; giving up after %d %s\n", result.failure.c_str(), options.max_restarts,
               options.max_restarts == 1 ? "restart" : "restarts");
}

// Between two attempts of a job whose nodes restart together: the heartbeats go on (so that no node takes this one
// for lost) while node 0 gathers every node's end of the attempt and decides. A node lost ends the job with 1, a
// signal to the launcher with 128 + its number, without a restart.
attempt_verdict await_verdict(peer_watch& peers, signal_pipe& signals, bool after_attempt = true) {
  if (after_attempt) peers.attempt_ended();
  for (;;) {
    if (const std::optional<std::string> lost = peers.on_wakeup())
      return {std::nullopt, 1, *lost, std::nullopt, std::nullopt, 0};
    if (std::optional<attempt_verdict> verdict = peers.verdict()) return *std::move(verdict);
    std::vector<pollfd> fds{{signals.read_end(), POLLIN, 0}};
    peers.add_fds(fds);
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(peers.next_wakeup() - steady_clock::now()).count();
    poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(left, 0, 60'000)));
    for (const received_signal& s : signals.take_signals()) {
      if (s.number == SIGCHLD) continue;
      return {std::nullopt,
              128 + s.number,
              "received " + sigabbrev(s.number) + " while waiting for the other nodes; not restarting",
              std::nullopt,
              std::nullopt,
              0};
    }
  }
}

bool coordinated(const supervision_options& options) {
  return options.peers != nullptr && options.peers->coordinates_restarts();
}

}  // namespace

int supervise_job(const supervision_options& options, const workers_for_attempt& workers) {
  signal_pipe signals;  // one for every attempt, so that a signal between two attempts is not lost
  std::optional<attempt_verdict> agreed;
  if (options.peers != nullptr && options.peers->starts_after_rendezvous()) {
    agreed = await_verdict(*options.peers, signals, /*after_attempt=*/false);
    if (!agreed->message.empty()) std::fprintf(stderr, "accel launch: %s\n", agreed->message.c_str());
    if (!agreed->master_port) return agreed->exit_code;
  }
  for (int restart_count = 0;; ++restart_count) {
    if (agreed) restart_count = agreed->attempt;  // node 0's count: the same on every node
    const std::vector<worker_spec> specs = workers(restart_count, agreed);
    const attempt_result result = supervise_workers(options, specs, signals);
    if (result.launcher_signal || result.peer_lost) return result.exit_code;  // stopped by the user, or a node lost
    if (coordinated(options)) {
      agreed = await_verdict(*options.peers, signals);
      if (!agreed->message.empty()) std::fprintf(stderr, "accel launch: %s\n", agreed->message.c_str());
      if (!agreed->master_port) return agreed->exit_code;
      continue;
    }
    if (result.exit_code == 0) return result.exit_code;  // done
    if (restart_count == options.max_restarts) {
      if (options.max_restarts > 0) announce_giving_up(result, options);
      return result.exit_code;
    }
    announce_restart(result, restart_count + 1, options);
    // Waiting lets the ended workers' ports and devices be released, and keeps a job that fails at once from
    // restarting in a tight loop.
    if (const std::optional<int> signal_number = signals.sleep_unless_signalled(options.restart_delay)) {
      std::fprintf(stderr, "accel launch: received %s before the restart; not restarting\n",
                   sigabbrev(*signal_number).c_str());
      return 128 + *signal_number;
    }
  }
}

}  // namespace accel::cli
