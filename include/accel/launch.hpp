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

#include "detail/config.hpp"

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

ACCEL_DECL std::optional<environment_variable> read_variable(std::string_view name);

/// Parses the leading integer of a variable; `whole` requires nothing after it.
ACCEL_DECL long parse_integer(const environment_variable& variable, long min, long max, bool whole = true);

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

ACCEL_DECL const launcher_family* detect_launcher();

}  // namespace detail

/// Reads the process environment, from the variables of the first launcher found (torchrun / `accel launch`,
/// Open MPI, MPICH, MVAPICH, SLURM's srun). Throws `accel::launch_error` naming the variable when they cannot
/// work: a rank without a world size, RANK >= WORLD_SIZE, several machines without MASTER_ADDR, a malformed
/// number. With no launcher at all, the process is a world of one.
ACCEL_DECL process_environment read_process_environment();

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/launch.ipp"
#endif
