// bigmodel.offload.cgroup (issue 33, "Inference beyond memory"): one process in its own cgroup v1 memory group with
// limit L runs a model of at least 3 L from disk offload, and its logits equal those of the same model held in memory
// by an unlimited process, bit for bit. L counts LibTorch's own baseline, measured first in the same kind of group.
//
//   accel_offload_under_limit DIR                          the driver (exits 77, skipped, without the controller)
//   accel_offload_under_limit --child DIR MODE LAYERS      inside the group: MODE baseline | disk | memory
#include "accel_headers.hpp"
#include <fcntl.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "offload_model.hpp"

namespace programs::offload_under_limit {

namespace {

namespace fs = std::filesystem;
constexpr std::int64_t vocab = 4096, width = 512, hidden = 2048, mib = 1 << 20;
const fs::path memory_root = "/sys/fs/cgroup/memory";

torch::Tensor tokens() { return torch::arange(0, 128, torch::kLong).mul(37).remainder(vocab).view({2, 64}); }

double cpu_ms() {
  timespec now{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

/// Per forward over 3 forwards (after one to warm up): wall-clock and CPU milliseconds (the CPU time counts this
/// process's own work, not the waits for the disk or for the other programs of a shared machine); the last logits.
struct timed {
  double wall_ms = 0, cpu_ms = 0;
  torch::Tensor logits;
};
timed timed_forwards(accel_test::OffloadLM& model) {
  torch::NoGradGuard no_grad;
  auto out = model->forward(tokens());
  const auto start = std::chrono::steady_clock::now();
  const auto cpu_start = cpu_ms();
  for (int i = 0; i < 3; ++i) out = model->forward(tokens());
  const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
  return {.wall_ms = took.count() / 3, .cpu_ms = (cpu_ms() - cpu_start) / 3, .logits = out};
}

std::int64_t peak_resident_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

/// Inside the group: `baseline` starts LibTorch and builds the model empty; `disk` runs it from disk offload and
/// writes its logits; `memory` loads it whole into memory (which the limit must not allow).
int child(const fs::path& dir, const std::string& mode, int layers) {
  accel_test::OffloadLM model{nullptr};
  {
    accel::init_empty_weights empty;
    model = accel_test::OffloadLM(vocab, width, hidden, layers);
  }
  model->eval();
  if (mode == "baseline") {
    torch::NoGradGuard no_grad;
    (void)torch::nn::Linear(8, 8)->forward(torch::ones({2, 8}));  // LibTorch's kernels started, as a forward does
    return 0;
  }
  const auto where = mode == "disk" ? accel::map_device::disk() : accel::map_device::cpu();
  const auto dispatched =
      accel::load_checkpoint_and_dispatch(*model, dir / "model.safetensors", {.map = {{"", where}}});
  const auto run = timed_forwards(model);
  accel::safetensors::save(dir / (mode + "_logits.safetensors"), {{"logits", run.logits}});
  std::ofstream(dir / (mode + "_figures.txt"))
      << run.wall_ms << " " << run.cpu_ms << " " << peak_resident_kib() << " " << dispatched.disk_bytes_read() << "\n";
  return 0;
}

/// A cgroup v1 memory group of this process's own, removed when it goes (after its processes have exited).
class memory_group {
 public:
  explicit memory_group(const std::string& name) : path_(memory_root / name) { fs::create_directory(path_); }
  memory_group(const memory_group&) = delete;
  memory_group& operator=(const memory_group&) = delete;
  ~memory_group() {
    for (int attempt = 0; attempt < 50 && fs::exists(path_); ++attempt) {
      if (::rmdir(path_.c_str()) == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the kernel lets go of an exited task lazily
    }
    if (fs::exists(path_)) std::cerr << "could not remove the cgroup " << path_ << "\n";
  }
  void write(const std::string& file, const std::string& value) const {
    std::ofstream out(path_ / file);
    out << value << std::flush;
    if (!out) throw std::runtime_error("cannot write " + value + " to " + (path_ / file).string());
  }
  [[nodiscard]] std::int64_t read(const std::string& file) const {
    std::int64_t value = -1;
    std::ifstream(path_ / file) >> value;
    return value;
  }
  /// Limits the group to `bytes` of memory (and of memory and swap, where the kernel counts swap), peak reset.
  void limit(std::int64_t bytes) const {
    write("memory.limit_in_bytes", std::to_string(bytes));
    if (fs::exists(path_ / "memory.memsw.limit_in_bytes")) write("memory.memsw.limit_in_bytes", std::to_string(bytes));
    write("memory.max_usage_in_bytes", "0");
  }
  /// Runs this program with `arguments` in the group; its wait status.
  [[nodiscard]] int run(const std::string& self, const std::vector<std::string>& arguments) const {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::ofstream(path_ / "cgroup.procs") << ::getpid() << std::flush;  // joins before exec: all it maps counts
      std::vector<char*> argv{const_cast<char*>(self.c_str())};
      for (const auto& a : arguments) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(self.c_str(), argv.data());
      std::_Exit(127);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  }

 private:
  fs::path path_;
};

/// Removes the groups earlier runs left behind (killed before their destructor ran: a CTest timeout) once empty.
void remove_stale_groups() {
  for (const auto& entry : accel::detail::directory_entries(memory_root)) {
    const auto name = entry.path().filename().string();
    std::ifstream procs(entry.path() / "cgroup.procs");
    std::string pid;
    if (name.rfind("accel_offload_", 0) == 0 && !(procs >> pid)) ::rmdir(entry.path().c_str());
  }
}

std::string skip_reason() {
  if (::geteuid() != 0) return "not root: cannot make a cgroup";
  if (!fs::exists(memory_root / "memory.limit_in_bytes"))
    return "no cgroup v1 memory controller at " + memory_root.string();
  return "";
}

/// Writes the model (seeded) to dir/model.safetensors, drops its pages from the page cache (so that the child's
/// reads are its own), and returns the in-memory logits and milliseconds per forward.
timed write_model(const fs::path& dir, int layers) {
  torch::manual_seed(11);
  accel_test::OffloadLM model(vocab, width, hidden, layers);
  model->eval();
  auto result = timed_forwards(model);
  accel::save_model(*model, dir);
  const auto file = dir / "model.safetensors";
  const int fd = ::open(file.c_str(), O_RDONLY);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return result;
}

bool exited_cleanly(int status, const std::string& what) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  std::cerr << "FAILED: " << what << " ended with " << (WIFSIGNALED(status) ? "signal " : "exit status ")
            << (WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)) << "\n";
  return false;
}

int driver(const std::string& self, const fs::path& dir) {
  if (const auto reason = skip_reason(); !reason.empty()) return std::cout << "SKIPPED: " << reason << "\n", 77;
  fs::create_directories(dir);
  remove_stale_groups();
  memory_group group("accel_offload_" + std::to_string(::getpid()));
  if (!exited_cleanly(group.run(self, {"--child", dir.string(), "baseline", "1"}), "the baseline run")) return 1;
  const auto baseline = group.read("memory.max_usage_in_bytes");
  // L: the baseline, the largest unit read in (the embedding, 8 MiB) twice over, activations and the reader's slack.
  const std::int64_t limit = baseline + 40 * mib;
  const auto block = accel_test::parameter_bytes(*accel_test::OffloadBlock(width, hidden));
  const int layers = static_cast<int>((3 * limit - 2 * vocab * width * 4) / block) + 1;
  const auto in_memory = write_model(dir, layers);
  const auto& expected = in_memory.logits;
  const auto model_bytes = static_cast<std::int64_t>(fs::file_size(dir / "model.safetensors"));
  group.limit(limit);
  if (!exited_cleanly(group.run(self, {"--child", dir.string(), "disk", std::to_string(layers)}), "disk offload"))
    return 1;
  const auto disk_peak = group.read("memory.max_usage_in_bytes");
  const auto got = accel::safetensors::load(dir / "disk_logits.safetensors").at(0).second;
  double disk_ms = 0, disk_cpu_ms = 0;
  std::int64_t hwm_kib = 0, read = 0;
  std::ifstream(dir / "disk_figures.txt") >> disk_ms >> disk_cpu_ms >> hwm_kib >> read;
  group.limit(limit);
  const auto whole = group.run(self, {"--child", dir.string(), "memory", std::to_string(layers)});
  std::cout << "baseline (LibTorch started, model built empty) " << baseline / mib << " MiB; limit L " << limit / mib
            << " MiB; model " << model_bytes / mib << " MiB (" << layers << " blocks, " << model_bytes * 100 / limit
            << "% of L)\ndisk offload: max_usage_in_bytes " << disk_peak / mib << " MiB, VmHWM " << hwm_kib / 1024
            << " MiB, " << disk_ms << " ms per forward (CPU " << disk_cpu_ms << " ms; " << read / 4 / mib
            << " MiB read per forward); in memory, unlimited: " << in_memory.wall_ms << " ms (CPU " << in_memory.cpu_ms
            << " ms)\nthe whole model in memory under L: "
            << (WIFSIGNALED(whole) ? "killed by signal " + std::to_string(WTERMSIG(whole)) : "not killed") << "\n";
  bool ok = model_bytes >= 3 * limit && torch::equal(got, expected);
  if (!torch::equal(got, expected)) std::cerr << "FAILED: the disk-offloaded logits differ from the in-memory ones\n";
  if (!(WIFSIGNALED(whole) && WTERMSIG(whole) == SIGKILL))
    ok = false, std::cerr << "FAILED: the whole model was not refused under L: L is not binding\n";
  accel::detail::remove_tree(dir);
  return ok ? 0 : 1;
}

}  // namespace

int run(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  torch::set_num_threads(1);  // the driver's forwards and the child's on one thread each: their times compare
  if (args.size() == 5 && args[1] == "--child") return child(args[2], args[3], std::stoi(args[4]));
  if (args.size() != 2) return std::cerr << "usage: " << args[0] << " DIR\n", 2;
  // Its children start as it was started: the name picks this program in accel_test_programs.
  const auto self = fs::absolute(args[0]).string();
  return driver(self, args[1]);
}

}  // namespace programs::offload_under_limit
