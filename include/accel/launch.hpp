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

/// One variable, under the first of its launcher-specific names that is set.
struct environment_variable {
  std::string_view name;
  std::string value;
};

template <std::size_t N>
std::optional<environment_variable> first_set(const std::string_view (&names)[N]) {
  for (auto name : names)
    if (const char* value = std::getenv(std::string(name).c_str()); value != nullptr && *value != '\0')
      return environment_variable{name, value};
  return std::nullopt;
}

inline long parse_integer(const environment_variable& variable, long min, long max) {
  long value = 0;
  const auto& text = variable.value;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || value < min || value > max)
    throw launch_error("accel: environment variable " + std::string(variable.name) + "=\"" + text +
                       "\" is not an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                       "]; start the program with `accel launch` or torchrun, which set it");
  return value;
}

// Each launcher's names for the same variable, torchrun's first (Accelerate's PartialState reads the same).
inline constexpr std::string_view rank_names[] = {
    "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"};
inline constexpr std::string_view world_size_names[] = {
    "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS"};
inline constexpr std::string_view local_rank_names[] = {
    "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
inline constexpr std::string_view local_world_size_names[] = {
    "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE",
    "SLURM_NTASKS_PER_NODE"};

}  // namespace detail

/// Reads the process environment. Throws `accel::launch_error` naming the variable when it is inconsistent: a
/// rank without a world size, RANK >= WORLD_SIZE, several machines without MASTER_ADDR, a malformed number.
/// With no variable at all, the process is a world of one.
inline process_environment read_process_environment() {
  using namespace detail;
  auto rank = first_set(rank_names);
  auto world_size = first_set(world_size_names);
  process_environment env;
  if (!rank && !world_size) return env;
  if (!rank || !world_size)
    throw launch_error(std::string("accel: ") + std::string(rank ? rank->name : world_size->name) +
                       " is set but " + (rank ? "WORLD_SIZE" : "RANK") +
                       " is not; a launcher sets both (accel launch --nproc_per_node N program, or torchrun)");
  env.world_size = static_cast<int>(parse_integer(*world_size, 1, 1 << 20));
  env.rank = static_cast<int>(parse_integer(*rank, 0, 1 << 20));
  if (env.rank >= env.world_size)
    throw launch_error("accel: " + std::string(rank->name) + "=" + rank->value + " must be smaller than " +
                       std::string(world_size->name) + "=" + world_size->value +
                       "; ranks run from 0 to WORLD_SIZE - 1");
  auto local_world_size = first_set(local_world_size_names);
  env.local_world_size = local_world_size ? static_cast<int>(parse_integer(*local_world_size, 1, env.world_size))
                                          : env.world_size;
  auto local_rank = first_set(local_rank_names);
  env.local_rank = local_rank ? static_cast<int>(parse_integer(*local_rank, 0, env.local_world_size - 1))
                              : env.rank % env.local_world_size;
  if (auto port = first_set({"MASTER_PORT"})) env.master_port = static_cast<std::uint16_t>(parse_integer(*port, 1, 65535));
  if (auto addr = first_set({"MASTER_ADDR"}))
    env.master_addr = addr->value;
  else if (!env.single_node())
    throw launch_error("accel: MASTER_ADDR is not set and the job spans several machines (LOCAL_WORLD_SIZE=" +
                       std::to_string(env.local_world_size) + " < WORLD_SIZE=" + std::to_string(env.world_size) +
                       "); set it to the address of the machine running rank 0 (accel launch --master_addr A)");
  return env;
}

}  // namespace accel
