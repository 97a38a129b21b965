/// \file
/// What launch_processes.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../launch_processes.hpp"

namespace accel {

launch_failure::launch_failure(const std::string& message, int process, std::string why, bool timeout)
    : launch_error(message), process_index(process), reason(std::move(why)), timed_out(timeout) {}
}  // namespace accel

namespace accel::detail::launching {

bool cuda_initialized() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (driver == nullptr) return false;
  using device_count_fn = int (*)(int*);
  const auto device_count = reinterpret_cast<device_count_fn>(dlsym(driver, "cuDeviceGetCount"));
  int devices = 0;
  const bool initialised = device_count != nullptr && device_count(&devices) != 3;
  dlclose(driver);
  return initialised;
}

void refuse_after_cuda(bool cuda_initialised) {
  if (cuda_initialised)
    throw launch_error(
        "accel::launch_processes: CUDA is already initialised in this process (by a CUDA tensor or call, or by "
        "torch::manual_seed or torch::cuda::is_available() on a machine with a GPU), and processes fork()ed from "
        "it cannot use CUDA; call launch_processes before anything touches CUDA, or run the job with `accel launch`");
}

void write_all(int fd, const std::string& text) {
  std::size_t written = 0;
  while (written < text.size()) {
    const auto count = ::write(fd, text.data() + written, text.size() - written);
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) return;  // the parent is gone: nothing left to tell
    written += static_cast<std::size_t>(count);
  }
}

void reset_signals() {
  for (const int signal : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL})
    std::signal(signal, SIG_DFL);
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_UNBLOCK, &all, nullptr);
}

std::string signal_name(int signal) {
  static constexpr std::pair<int, const char*> names[] = {
      {SIGABRT, "SIGABRT"}, {SIGSEGV, "SIGSEGV"}, {SIGKILL, "SIGKILL"}, {SIGTERM, "SIGTERM"}, {SIGBUS, "SIGBUS"},
      {SIGFPE, "SIGFPE"},   {SIGILL, "SIGILL"},   {SIGINT, "SIGINT"},   {SIGHUP, "SIGHUP"},   {SIGQUIT, "SIGQUIT"},
      {SIGPIPE, "SIGPIPE"}, {SIGUSR1, "SIGUSR1"}, {SIGUSR2, "SIGUSR2"}, {SIGTRAP, "SIGTRAP"}, {SIGXCPU, "SIGXCPU"}};
  for (const auto& [number, name] : names)
    if (number == signal) return std::string(name) + " (" + strsignal(signal) + ")";
  return "signal " + std::to_string(signal);
}

std::string failure_of(const launched_process& process) {
  const int status = process.status;
  if (WIFSIGNALED(status)) return "killed by signal " + signal_name(WTERMSIG(status));
  if (!process.message.empty() && process.message.front() == threw_mark) return "threw " + process.message.substr(1);
  if (WEXITSTATUS(status) != 0) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (process.message.empty() || process.message.front() != returned_mark)
    return "exited with status 0 before the function returned (std::exit called inside it?)";
  return {};
}

process_job::~process_job() {
  signal_running(SIGKILL);
  for (auto& process : processes_) {
    if (process.fd >= 0) close(process.fd);
    if (process.pid > 0 && !process.reaped) waitpid(process.pid, &process.status, 0);
  }
}

std::vector<std::string> process_job::wait() {
  while (std::any_of(processes_.begin(), processes_.end(), [](const auto& p) { return !p.reaped; })) {
    wait_for_news();
    reap_ended();
    check_deadlines();
  }
  if (failed_ >= 0) throw_failure();
  std::vector<std::string> results;
  for (const auto& process : processes_) results.push_back(process.message.substr(1));
  return results;
}

void process_job::throw_system_error(const std::string& what) {
  throw launch_error("accel::launch_processes: " + what + ": " + std::strerror(errno));
}

void process_job::wait_for_news() {
  std::vector<pollfd> watched;
  for (const auto& process : processes_)
    if (process.fd >= 0) watched.push_back({process.fd, POLLIN, 0});
  const auto until_deadline =
      std::chrono::duration_cast<std::chrono::milliseconds>((stopping_ ? kill_at_ : deadline_) - clock::now());
  const auto wait = std::clamp<long long>(until_deadline.count() + 1, 1, 100);
  poll(watched.data(), watched.size(), static_cast<int>(wait));
  for (auto& process : processes_) read_available(process);
}

void process_job::read_available(launched_process& process) {
  char buffer[4096];
  while (process.fd >= 0) {
    const auto count = read(process.fd, buffer, sizeof buffer);
    if (count > 0) {
      process.message.append(buffer, static_cast<std::size_t>(count));
    } else if (count == 0 || errno != EINTR) {
      if (count == 0 || errno != EAGAIN) {  // its end, or a broken pipe: nothing more will come
        close(process.fd);
        process.fd = -1;
      }
      return;
    }
  }
}

void process_job::reap_ended() {
  for (std::size_t rank = 0; rank < processes_.size(); ++rank) {
    auto& process = processes_[rank];
    if (process.reaped) continue;
    const pid_t ended = waitpid(process.pid, &process.status, WNOHANG);
    if (ended == -1 && errno == ECHILD)
      process.status = 0;  // reaped by the system: the caller ignores SIGCHLD
    else if (ended != process.pid)
      continue;
    process.reaped = true;
    read_available(process);  // what it wrote just before it ended
    if (stopping_) continue;  // stopped by us, or failing after the first failure: not the cause
    if (failure_of(process).empty()) continue;
    failed_ = static_cast<int>(rank);
    begin_stopping();
  }
}

void process_job::check_deadlines() {
  if (!stopping_ && clock::now() >= deadline_) {
    timed_out_ = true;
    const auto running = std::find_if(processes_.begin(), processes_.end(), [](const auto& p) { return !p.reaped; });
    failed_ = static_cast<int>(running - processes_.begin());
    begin_stopping();
  }
  if (stopping_ && clock::now() >= kill_at_) signal_running(SIGKILL);
}

void process_job::begin_stopping() {
  stopping_ = true;
  kill_at_ = clock::now() + options_.grace_period;
  signal_running(SIGTERM);
}

void process_job::signal_running(int signal) {
  for (const auto& process : processes_)
    if (process.pid > 0 && !process.reaped && kill(-process.pid, signal) != 0) kill(process.pid, signal);
}

void process_job::throw_failure() const {
  const std::string job =
      "accel::launch_processes: process " + std::to_string(failed_) + " of " + std::to_string(processes_.size());
  if (timed_out_) {
    const auto seconds = std::chrono::duration<double>(options_.timeout).count();
    std::ostringstream reason;
    reason << "still running after the timeout of " << seconds << " s";
    const auto message = job + " was " + reason.str() + " (process_launch_options::timeout): every process was stopped";
    throw launch_failure(message, failed_, reason.str(), true);
  }
  const std::string reason = failure_of(processes_[std::size_t(failed_)]);
  throw launch_failure(job + " failed: " + reason + "; the other processes were stopped", failed_, reason, false);
}

}  // namespace accel::detail::launching
