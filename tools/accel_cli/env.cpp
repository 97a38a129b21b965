// `accel env`: one "name: value" line per fact, for bug reports. The machine (platform, CPU, memory), LibTorch as
// accel-selftest sees it (version, CUDA, Gloo, threads), the CUDA driver, runtime and NCCL found by dlopen (the
// libraries data_parallel<nccl> uses, with no GPU needed to report them), the config file, and the environment
// variables that steer accel, its launchers, LibTorch, Gloo and NCCL.
#include "env.hpp"

#include <dlfcn.h>
#include <link.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "accel/config_file.hpp"
#include "job_secret.hpp"
#include "selftest_program.hpp"

extern char** environ;

namespace accel::cli {
namespace {

void print_fact(std::string_view name, const std::string& value) {
  std::printf("%-28.*s %s\n", static_cast<int>(name.size() + 1), (std::string(name) + ":").c_str(), value.c_str());
}

// The value of the first "key<sep>value" line of a file whose key is `key`, trimmed and unquoted (as the config
// file's values are).
std::optional<std::string> field_of(const char* file, std::string_view key, char separator) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const std::string_view text = line;
    const auto at = text.find(separator);
    if (at == std::string_view::npos || detail::trim(text.substr(0, at)) != key) continue;
    return std::string(detail::unquote(detail::trim(text.substr(at + 1))));
  }
  return std::nullopt;
}

void print_machine() {
  utsname names{};
  uname(&names);
  print_fact("platform", std::string(names.sysname) + " " + names.release + " " + names.machine + " (" +
                             field_of("/etc/os-release", "PRETTY_NAME", '=').value_or("unknown distribution") + ")");
  print_fact("CPU", field_of("/proc/cpuinfo", "model name", ':').value_or("unknown") + ", " +
                        std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " cores online");
  if (auto total = field_of("/proc/meminfo", "MemTotal", ':')) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GiB", std::strtod(total->c_str(), nullptr) / (1024.0 * 1024.0));
    print_fact("memory", text);
  }
}

// LibTorch's own view, from accel-selftest (which prints "name: value" lines).
void print_libtorch() {
  const auto program = selftest_program();
  if (!program) {
    print_fact("LibTorch", "unknown: " + selftest_missing_message());
    return;
  }
  std::string command = "'";  // built by appending: GCC 12 warns falsely (-Wrestrict) on "'" + string + ...
  command.append(program->string()).append("' env 2>&1");
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) {
    print_fact("LibTorch", "unknown: cannot run " + program->string());
    return;
  }
  std::array<char, 4096> line{};
  while (std::fgets(line.data(), line.size(), pipe.get()) != nullptr) std::fputs(line.data(), stdout);
}

// A shared library found as the dynamic loader would, or in the CUDA toolkit's directory.
struct library {
  void* handle = nullptr;
  std::string path;
};

std::optional<library> open_library(std::initializer_list<const char*> names) {
  std::vector<std::string> directories = {""};
  if (const char* home = std::getenv("CUDA_HOME"); home != nullptr && *home != '\0')
    directories.push_back(std::string(home) + "/lib64/");
  directories.push_back("/usr/local/cuda/lib64/");
  for (const auto& directory : directories) {
    for (const char* name : names) {
      void* handle = dlopen((directory + name).c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) continue;
      link_map* map = nullptr;
      dlinfo(handle, RTLD_DI_LINKMAP, &map);
      return library{handle, map != nullptr ? map->l_name : directory + name};
    }
  }
  return std::nullopt;
}

template <class Function>
Function* symbol(const library& lib, const char* name) {
  return reinterpret_cast<Function*>(dlsym(lib.handle, name));
}

// CUDA's and NCCL's version numbers: major * 1000 + minor * 10 (CUDA), major * 10000 + minor * 100 + patch (NCCL).
std::string cuda_version(int code) { return std::to_string(code / 1000) + "." + std::to_string(code % 1000 / 10); }
std::string nccl_version(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." + std::to_string(code % 100);
}

void print_cuda_driver() {
  const auto driver = open_library({"libcuda.so.1"});
  if (!driver) {
    print_fact("CUDA driver", "none (libcuda.so.1 not found: no NVIDIA driver, so no GPU for accel)");
    return;
  }
  int version = 0, count = 0;
  if (auto get_version = symbol<int(int*)>(*driver, "cuDriverGetVersion")) get_version(&version);
  const auto init = symbol<int(unsigned)>(*driver, "cuInit");
  const auto get_count = symbol<int(int*)>(*driver, "cuDeviceGetCount");
  const auto get_device = symbol<int(int*, int)>(*driver, "cuDeviceGet");
  const auto get_name = symbol<int(char*, int, int)>(*driver, "cuDeviceGetName");
  if (init == nullptr || get_count == nullptr || init(0) != 0 || get_count(&count) != 0) count = 0;
  print_fact("CUDA driver", cuda_version(version) + " (" + driver->path + "), " + std::to_string(count) + " GPU" +
                                (count == 1 ? "" : "s"));
  for (int i = 0; i < count && get_device != nullptr && get_name != nullptr; ++i) {
    int device = 0;
    std::array<char, 256> name{};
    if (get_device(&device, i) == 0 && get_name(name.data(), static_cast<int>(name.size()), device) == 0)
      print_fact("  GPU " + std::to_string(i), name.data());
  }
}

void print_cuda_libraries() {
  if (const auto runtime = open_library({"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"})) {
    int version = 0;
    if (auto get = symbol<int(int*)>(*runtime, "cudaRuntimeGetVersion")) get(&version);
    print_fact("CUDA runtime", cuda_version(version) + " (" + runtime->path + ")");
  } else {
    print_fact("CUDA runtime", "not found (libcudart.so: install the CUDA toolkit or set CUDA_HOME)");
  }
  if (const auto nccl = open_library({"libnccl.so.2", "libnccl.so"})) {
    int version = 0;
    if (auto get = symbol<int(int*)>(*nccl, "ncclGetVersion")) get(&version);
    print_fact("NCCL", nccl_version(version) + " (" + nccl->path + ")");
  } else {
    print_fact("NCCL", "not found (libnccl.so.2: data_parallel<nccl> needs it; set CUDA_HOME or NCCL_ROOT)");
  }
}

void print_config_file() {
  const auto path = config_file_path();
  const bool named = std::getenv("ACCEL_CONFIG_FILE") != nullptr;
  if (!path) {
    print_fact("config file",
               named ? "none (ACCEL_CONFIG_FILE is set empty)" : "none (neither XDG_CONFIG_HOME nor HOME is set)");
    return;
  }
  std::error_code ignored;
  if (!std::filesystem::exists(*path, ignored)) {
    print_fact("config file",
               path->string() + (named ? " (MISSING: ACCEL_CONFIG_FILE names it, so programs and accel launch fail; "
                                         "write it with 'accel config' or unset the variable)"
                                       : " (none there; 'accel config' writes one)"));
    return;
  }
  print_fact("config file", path->string());
  try {
    const config_values values = read_config_file(*path);
    for (const auto& key : detail::config_keys)  // the settings it has, as the file writes them
      if (const auto value = key.get(values))
        std::printf("  %.*s: %s\n", static_cast<int>(key.name.size()), key.name.data(), value->c_str());
  } catch (const config_error& e) {
    std::printf("  unreadable: %s\n", e.what());
  }
}

bool steers_accel(std::string_view name) {
  static constexpr std::string_view prefixes[] = {"ACCEL",        "TORCH",           "NCCL_",
                                                  "GLOO_",        "CUDA_",           "OMP_",
                                                  "MKL_",         "OPENBLAS_",       "OMPI_COMM_WORLD_",
                                                  "PMI_",         "MV2_COMM_WORLD_", "SLURM_PROCID",
                                                  "SLURM_NTASKS", "SLURM_LOCALID",   "SLURM_STEP_"};
  static constexpr std::string_view names[] = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                               "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "NODE_RANK"};
  for (auto prefix : prefixes)
    if (name.starts_with(prefix)) return true;
  for (auto exact : names)
    if (name == exact) return true;
  return false;
}

void print_environment() {
  std::vector<std::string> set;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view variable(*entry);
    const std::string_view name = variable.substr(0, variable.find('='));
    if (name == job_secret_variable)  // shown by its length alone: this output is meant to be pasted into reports
      set.emplace_back(std::string(name) + "=(set, " + std::to_string(variable.size() - name.size() - 1) +
                       " characters, not shown)");
    else if (steers_accel(name))
      set.emplace_back(variable);
  }
  std::sort(set.begin(), set.end());
  print_fact("environment", set.empty() ? "none of the variables accel, its launchers, LibTorch, Gloo or NCCL read"
                                        : std::to_string(set.size()) + " variable" + (set.size() == 1 ? "" : "s"));
  for (const auto& variable : set) std::printf("  %s\n", variable.c_str());
}

std::string compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "g++ " __VERSION__;
#else
  return "an unknown compiler";
#endif
}

}  // namespace

int env_main(const std::vector<std::string>& args) {
  if (!args.empty()) {
    if (args.front() == "--help" || args.front() == "-h") {
      std::puts("usage: accel env\n\nPrints this machine's setup for accel, for bug reports: copy it into the report.");
      return exit_ok;
    }
    throw usage_error("accel env takes no arguments, not '" + args.front() + "'");
  }
  print_fact("accel", ACCEL_VERSION_STRING);
  print_machine();
  print_fact("accel tool built with", compiler());
  print_libtorch();
  print_cuda_driver();
  print_cuda_libraries();
  print_config_file();
  print_environment();
  return exit_ok;
}

}  // namespace accel::cli
