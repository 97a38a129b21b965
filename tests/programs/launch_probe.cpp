// A worker for the `accel launch` tests (no LibTorch): what it does depends on its first argument.
//   env PREFIX             write the launcher's variables to PREFIX.<RANK>, one NAME=value a line
//   exit CODE              exit with CODE
//   hello                  two lines on stdout, one on stderr, then a last stdout line without '\n'
//   fail RANK CODE DIR     write DIR/pid.<RANK>; rank RANK exits with CODE after 300 ms, the others sleep 60 s
//                          and, on SIGTERM, write DIR/term.<RANK> and die of it
//   stubborn RANK CODE DIR like fail, but the others ignore SIGTERM (only SIGKILL stops them)
//   crash RANK DIR         like fail, but rank RANK dies of SIGSEGV
//   family RANK CODE DIR   like fail, but each other rank first forks a child that writes DIR/child.<RANK> and
//                          sleeps: the launcher's signal to the worker's process group must reach it too
//   sleep DIR              write DIR/pid.<RANK> and sleep 60 s
//   sleep_ignoring_sigterm DIR  the same, with SIGTERM ignored
//   flaky RANK CODE ATTEMPTS DIR  for restarts: each start appends "restart=K rank=R pid=P earlier_alive=A" to
//                          DIR/starts (K: ACCEL_RESTART_COUNT; A: how many workers of earlier attempts are still
//                          alive) after writing the variables to DIR/vars.K.<RANK>. While K < ATTEMPTS, rank RANK waits
//                          until every worker of the attempt (on every node) has started, then exits with CODE (or
//                          dies of signal -CODE when CODE is negative), and the others sleep 60 s; from attempt
//                          ATTEMPTS on, every worker exits 0
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "<unset>";
}

int rank() { return std::atoi(variable("RANK").c_str()); }

// Written under a temporary name and renamed, so the test never reads half a file.
void write_file(const std::string& path, const std::string& content) {
  const std::string temporary = path + ".tmp";
  std::ofstream(temporary) << content;
  std::rename(temporary.c_str(), path.c_str());
}

void write_pid(const std::string& directory, const std::string& kind) {
  write_file(directory + "/" + kind + "." + std::to_string(rank()), std::to_string(getpid()) + "\n");
}

// Set before the handler runs: a signal handler may only touch async-signal-safe state.
char term_marker_path[4096];

void on_sigterm(int) {
  const int fd = open(term_marker_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) close(fd);
  signal(SIGTERM, SIG_DFL);
  raise(SIGTERM);
}

[[noreturn]] void sleep_then_exit() {
  std::this_thread::sleep_for(std::chrono::seconds(60));
  std::exit(0);
}

void sleep_ms(int milliseconds) { std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds)); }

int write_environment(const std::string& prefix) {
  std::string content;
  for (const char* name :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "ACCELERATE_MIXED_PRECISION",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "ACCEL_CONFIG_FILE", "ACCEL_RESTART_COUNT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID"}) {
    content += std::string(name) + "=" + variable(name) + "\n";
  }
  write_file(prefix + "." + variable("RANK"), content);
  return 0;
}

// Each line goes out in one write (std::cerr would write "warning from rank ", the rank and "\n" separately, and
// the workers' pieces would interleave on a shared stderr).
int hello() {
  const std::string r = std::to_string(rank());
  const std::string out = "hello from rank " + r + "\nsecond line from rank " + r + "\n";
  const std::string err = "warning from rank " + r + "\n";
  const std::string partial = "partial line from rank " + r;
  for (const auto& [fd, text] : {std::pair{1, &out}, {2, &err}, {1, &partial}}) {
    if (write(fd, text->data(), text->size()) != static_cast<ssize_t>(text->size())) return 1;
  }
  return 0;
}

// fail, stubborn, crash and family: the chosen rank fails, the others wait to be stopped.
int fail_one(const std::string& mode, int failing_rank, int code, const std::string& directory) {
  if (rank() != failing_rank) {
    if (mode == "family" && fork() == 0) {
      write_pid(directory, "child");
      sleep_then_exit();
    }
    if (mode == "stubborn") {
      signal(SIGTERM, SIG_IGN);
    } else {
      std::snprintf(term_marker_path, sizeof term_marker_path, "%s/term.%d", directory.c_str(), rank());
      signal(SIGTERM, on_sigterm);
    }
  }
  write_pid(directory, "pid");
  if (rank() != failing_rank) sleep_then_exit();
  sleep_ms(300);
  if (mode == "crash") {
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  // no core file left behind by the test
    raise(SIGSEGV);
  }
  return code;
}

// Whether a process exists and is not a zombie.
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const std::size_t end_of_name = content.rfind(')');
  return end_of_name != std::string::npos && content.find(" Z ", end_of_name) != end_of_name + 1;
}

struct start_record {
  int restart = 0;
  pid_t pid = 0;
};

std::vector<start_record> read_starts(const std::string& path) {
  std::vector<start_record> starts;
  std::ifstream file(path);
  for (std::string line; std::getline(file, line);) {
    start_record start;
    if (std::sscanf(line.c_str(), "restart=%d rank=%*d pid=%d", &start.restart, &start.pid) == 2)
      starts.push_back(start);
  }
  return starts;
}

// One write with O_APPEND, so that the lines of workers starting together do not mix.
void log_start(const std::string& path, int restart) {
  int earlier_alive = 0;
  for (const start_record& start : read_starts(path)) {
    if (start.restart < restart && alive(start.pid)) ++earlier_alive;
  }
  const std::string line = "restart=" + std::to_string(restart) + " rank=" + std::to_string(rank()) +
                           " pid=" + std::to_string(getpid()) + " earlier_alive=" + std::to_string(earlier_alive) +
                           "\n";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0 || write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::exit(70);
  close(fd);
}

int flaky(int failing_rank, int code, int failing_attempts, const std::string& directory) {
  const int restart = std::atoi(variable("ACCEL_RESTART_COUNT").c_str());
  const std::string starts_path = directory + "/starts";
  write_environment(directory + "/vars." + std::to_string(restart));  // before the start counts, see below
  log_start(starts_path, restart);
  if (restart >= failing_attempts) return 0;
  if (rank() != failing_rank) sleep_then_exit();
  const auto started_here = [&] {
    const std::vector<start_record> starts = read_starts(starts_path);
    return std::count_if(starts.begin(), starts.end(), [&](const start_record& s) { return s.restart == restart; });
  };
  for (int waited_ms = 0; started_here() < std::atoi(variable("WORLD_SIZE").c_str()) && waited_ms < 20'000;
       waited_ms += 10) {
    sleep_ms(10);
  }
  if (code < 0) raise(-code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const auto arg = [&](int i) { return std::string(i < argc ? argv[i] : ""); };
  if (mode == "env") return write_environment(arg(2));
  if (mode == "exit") return std::atoi(arg(2).c_str());
  if (mode == "hello") return hello();
  if (mode == "fail" || mode == "stubborn" || mode == "family") {
    return fail_one(mode, std::atoi(arg(2).c_str()), std::atoi(arg(3).c_str()), arg(4));
  }
  if (mode == "crash") return fail_one(mode, std::atoi(arg(2).c_str()), 0, arg(3));
  if (mode == "flaky") {
    return flaky(std::atoi(arg(2).c_str()), std::atoi(arg(3).c_str()), std::atoi(arg(4).c_str()), arg(5));
  }
  if (mode == "sleep" || mode == "sleep_ignoring_sigterm") {
    if (mode == "sleep_ignoring_sigterm") signal(SIGTERM, SIG_IGN);
    write_pid(arg(2), "pid");
    sleep_then_exit();
  }
  std::cerr << "launch_probe: unknown mode '" << mode << "' (see the comment at the top of launch_probe.cpp)\n";
  return 64;
}
