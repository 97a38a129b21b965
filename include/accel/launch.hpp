/// \file
/// Where this process sits in a job: its rank, the world size and the rendezvous address, read from the
/// environment that a launcher sets. `accel launch`, PyTorch's `torchrun`, `mpirun` (Open MPI, MPICH/PMI,
/// MVAPICH) and SLURM's `srun` all work; a program started on its own is a world of one.
#pragma once

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace accel {

/// A launch environment that cannot work: names the variable and the fix.
struct launch_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The process's place in the job.
struct process_environment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  std::uint16_t master_port = 29500;

  /// True when no launcher started this process (a world of one: no rendezvous, no port).
  [[nodiscard]] bool standalone() const noexcept { return world_size == 1; }
  /// True when every process of the job runs on this machine.
  [[nodiscard]] bool single_node() const noexcept { return local_world_size == world_size; }
};

namespace detail {

/// One variable as the environment has it.
struct environment_variable {
  std::string_view name;
  std::string value;
};

inline std::optional<environment_variable> read_variable(std::string_view name) {
  if (name.empty()) return std::nullopt;
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return environment_variable{name, value};
}

/// Parses the leading integer of a variable; `whole` requires nothing after it.
inline long parse_integer(const environment_variable& variable, long min, long max, bool whole = true) {
  long value = 0;
  const auto& text = variable.value;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || (whole && end != text.data() + text.size()) || value < min || value > max)
    throw launch_error("accel: environment variable " + std::string(variable.name) + "=\"" + text +
                       "\" is not an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                       "]; it comes from the launcher (or your job script): fix it there");
  return value;
}

/// What one launcher calls the four numbers. A family is used whole, never mixed with another's variables.
struct launcher_family {
  std::string_view launcher;
  std::string_view rank, world_size, local_rank, local_world_size;
};

// In Accelerate's order of preference; SLURM only inside an `srun` job step (a batch script alone has
// SLURM_PROCID but is one process).
inline constexpr launcher_family launcher_families[] = {
    {"torchrun or accel launch", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI's mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"MPICH's mpirun (PMI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"MVAPICH's mpirun", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE"},
    {"SLURM's srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"},
};

inline const launcher_family* detect_launcher() {
  for (const auto& family : launcher_families) {
    const bool slurm = family.rank == "SLURM_PROCID";
    if (read_variable(family.rank) && (!slurm || read_variable(family.world_size))) return &family;
    if (!slurm && read_variable(family.world_size)) return &family;
  }
  return nullptr;
}

}  // namespace detail

/// Reads the process environment, from the variables of the first launcher found (torchrun / `accel launch`,
/// Open MPI, MPICH, MVAPICH, SLURM's srun). Throws `accel::launch_error` naming the variable when they cannot
/// work: a rank without a world size, RANK >= WORLD_SIZE, several machines without MASTER_ADDR, a malformed
/// number. With no launcher at all, the process is a world of one.
inline process_environment read_process_environment() {
  using namespace detail;
  process_environment env;
  const auto* family = detect_launcher();
  if (family == nullptr) return env;
  auto rank = read_variable(family->rank);
  auto world_size = read_variable(family->world_size);
  if (!rank || !world_size)
    throw launch_error("accel: " + std::string(rank ? family->rank : family->world_size) + " is set but " +
                       std::string(rank ? family->world_size : family->rank) + " is not; " +
                       std::string(family->launcher) +
                       " sets both. Start the program with its launcher (accel launch --nproc_per_node N program, "
                       "or torchrun), or unset the variable to run one process");
  env.world_size = static_cast<int>(parse_integer(*world_size, 1, 1 << 20));
  env.rank = static_cast<int>(parse_integer(*rank, 0, 1 << 20));
  if (env.rank >= env.world_size)
    throw launch_error("accel: " + std::string(family->rank) + "=" + rank->value + " must be smaller than " +
                       std::string(family->world_size) + "=" + world_size->value +
                       "; ranks run from 0 to the world size - 1");
  // SLURM writes "2(x3)" for three machines of two tasks: the leading number is this machine's count when the
  // layout is uniform (no comma).
  auto local_world_size = read_variable(family->local_world_size);
  const bool local_size_known = local_world_size && local_world_size->value.find(',') == std::string::npos;
  auto local_rank = read_variable(family->local_rank);
  if (local_size_known) {
    env.local_world_size = static_cast<int>(parse_integer(*local_world_size, 1, env.world_size, /*whole=*/false));
    env.local_rank = local_rank ? static_cast<int>(parse_integer(*local_rank, 0, env.local_world_size - 1))
                                : env.rank % env.local_world_size;
  } else {  // unknown: do not assume one machine (loopback would cut the others off)
    env.local_world_size = 1;
    env.local_rank = local_rank ? static_cast<int>(parse_integer(*local_rank, 0, env.world_size - 1)) : 0;
  }
  if (auto port = read_variable("MASTER_PORT"))
    env.master_port = static_cast<std::uint16_t>(parse_integer(*port, 1, 65535));
  if (auto addr = read_variable("MASTER_ADDR"))
    env.master_addr = addr->value;
  else if (!env.single_node())
    throw launch_error(
        "accel: MASTER_ADDR is not set and the job may span several machines (" +
        (local_size_known ? std::string(family->local_world_size) + "=" + local_world_size->value + " < " +
                                std::string(family->world_size) + "=" + world_size->value
                          : std::string(family->local_world_size) + " is not set or not uniform") +
        "); set MASTER_ADDR to the address of the machine running rank 0 (accel launch --master_addr A)");
  return env;
}

}  // namespace accel
