/// \file
/// What launch.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../launch.hpp"

namespace accel::detail {

std::optional<environment_variable> read_variable(std::string_view name) {
  if (name.empty()) return std::nullopt;
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return environment_variable{name, value};
}

long parse_integer(const environment_variable& variable, long min, long max, bool whole) {
  long value = 0;
  const auto& text = variable.value;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || (whole && end != text.data() + text.size()) || value < min || value > max)
    throw launch_error("accel: environment variable " + std::string(variable.name) + "=\"" + text +
                       "\" is not an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                       "]; it comes from the launcher (or your job script): fix it there");
  return value;
}

const launcher_family* detect_launcher() {
  for (const auto& family : launcher_families) {
    const bool slurm = family.rank == "SLURM_PROCID";
    if (read_variable(family.rank) && (!slurm || read_variable(family.world_size))) return &family;
    if (!slurm && read_variable(family.world_size)) return &family;
  }
  return nullptr;
}
}  // namespace accel::detail

namespace accel {

process_environment read_process_environment() {
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
