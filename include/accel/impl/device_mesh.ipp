/// \file
/// What device_mesh.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../device_mesh.hpp"

#include <cstdlib>

namespace accel::detail {

std::string describe(const mesh_sizes& sizes) {
  return "dp_replicate=" + std::to_string(sizes.dp_replicate) + ", dp_shard=" + std::to_string(sizes.dp_shard) +
         ", cp=" + std::to_string(sizes.cp) + ", tp=" + std::to_string(sizes.tp) +
         (sizes.pp > 1 ? ", pp=" + std::to_string(sizes.pp) : std::string());
}
}  // namespace accel::detail

namespace accel {

mesh_sizes mesh_sizes_from_environment() {
  mesh_sizes sizes;
  for (const auto& [name, key, size, given] : detail::mesh_size_variables) {
    const auto variable = detail::read_variable(name);
    if (!variable) continue;
    const auto& text = variable->value;
    int value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc{} || end != text.data() + text.size() || value < 1)
      throw mesh_error("accel: " + std::string(name) + "=\"" + text +
                       "\" is not a whole number >= 1; set it to the dimension's size, or unset it (1: the "
                       "dimension is not used)");
    sizes.*size = value;
  }
  return sizes;
}

bool parallelism_config_in_environment() {
  if (const auto flag = detail::read_variable(detail::use_parallelism_config_variable)) {
    std::string value;
    for (char c : flag->value) value += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    for (std::string_view yes : {"1", "true", "t", "yes", "y", "on"})
      if (value == yes) return true;
    for (std::string_view no : {"0", "false", "f", "no", "n", "off"})
      if (value == no) return false;
    throw mesh_error("accel: " + std::string(detail::use_parallelism_config_variable) + "=\"" + flag->value +
                     "\" is neither true nor false; set it to true (build the mesh of PARALLELISM_CONFIG_*_SIZE) or "
                     "false, or unset it");
  }
  for (const auto& entry : detail::mesh_size_variables)
    if (detail::read_variable(entry.variable)) return true;
  return false;
}

mesh_sizes validate_mesh(mesh_sizes sizes, int num_processes) {
  for (const auto& [name, key, size, given] : detail::mesh_size_variables)
    if (sizes.*size < 1)
      throw mesh_error("accel: mesh " + detail::describe(sizes) + ": every size must be at least 1 (1: the " +
                       "dimension is not used); fix " + std::string(name) + " or the size given in the program");
  if (detail::parallel_beside_pure_replication(sizes))
    throw mesh_error("accel: mesh " + detail::describe(sizes) +
                     ": tp or cp beside pure replication (dp_replicate > 1, dp_shard == 1) is refused, as in "
                     "Accelerate; set dp_shard > 1 (HSDP with tp/cp) or dp_replicate = 1 (FSDP with tp/cp)");
  if (sizes.total() == 1) {
    sizes.dp_replicate = num_processes;
    return sizes;
  }
  if (sizes.total() != num_processes) {
    const auto others = mesh_sizes{.dp_shard = sizes.dp_shard, .cp = sizes.cp, .tp = sizes.tp, .pp = sizes.pp}.total();
    std::string fix = "make their product equal the number of processes";
    auto suggested = sizes;
    suggested.dp_replicate = static_cast<int>(num_processes / others);
    if (num_processes % others == 0 && !detail::parallel_beside_pure_replication(suggested))
      fix += " (here dp_replicate = " + std::to_string(num_processes) + " / (dp_shard x cp x tp" +
             (sizes.pp > 1 ? " x pp" : "") + ") = " + std::to_string(num_processes / others) + ")";
    throw mesh_error("accel: mesh " + detail::describe(sizes) + " spans " + std::to_string(sizes.total()) +
                     " processes (Accelerate's total_size) but the job has " + std::to_string(num_processes) + "; " +
                     fix + ", or start " + std::to_string(sizes.total()) + " processes");
  }
  return sizes;
}

mesh_layout::mesh_layout(const mesh_sizes& sizes, int num_processes)
    : sizes_(validate_mesh(sizes, num_processes)), num_processes_(num_processes) {
  const std::pair<std::string_view, int> named[] = {{"pp", sizes_.pp},
                                                    {"dp_replicate", sizes_.dp_replicate},
                                                    {"dp_shard", sizes_.dp_shard},
                                                    {"cp", sizes_.cp},
                                                    {"tp", sizes_.tp}};
  for (const auto& [name, size] : named)
    if (size > 1) {
      dimensions_.push_back({std::string(name), {shape_.size()}});
      shape_.push_back(size);
    }
  flatten("dp", {"dp_replicate", "dp_shard"});
  flatten("dp_shard_cp", {"dp_shard", "cp"});
  flatten("dp_cp", {"dp_replicate", "dp_shard", "cp"});
}

std::vector<int> mesh_layout::coordinates(int rank) const {
  check_rank(rank);
  std::vector<int> coordinates(shape_.size());
  for (std::size_t axis = shape_.size(); axis-- > 0; rank /= shape_[axis]) coordinates[axis] = rank % shape_[axis];
  return coordinates;
}

int mesh_layout::size(std::string_view name) const {
  int product = 1;
  for (auto axis : dimension(name).axes) product *= shape_[axis];
  return product;
}

int mesh_layout::local_rank(std::string_view name, int rank) const {
  const auto at = coordinates(rank);
  int index = 0;
  for (auto axis : dimension(name).axes) index = index * shape_[axis] + at[axis];
  return index;
}

int mesh_layout::index_along(std::string_view name, int rank) const {
  const auto& names = detail::mesh_dimension_names;
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw mesh_error("accel: \"" + std::string(name) +
                     "\" is not a mesh dimension; use pp, dp_replicate, dp_shard, cp, tp, dp, dp_shard_cp or dp_cp");
  check_rank(rank);
  return has(name) ? local_rank(name, rank) : 0;
}

bool mesh_layout::counts_its_batch(int rank) const {
  return index_along("tp", rank) == 0 && index_along("cp", rank) == 0 && index_along("pp", rank) == sizes_.pp - 1;
}

std::vector<int> mesh_layout::group_of(std::string_view name, int rank) const {
  const auto& axes = dimension(name).axes;
  const auto fixed = coordinates(rank);
  std::vector<int> members;
  for (int index = 0; index < size(name); ++index) {
    auto at = fixed;
    int rest = index;
    for (std::size_t i = axes.size(); i-- > 0; rest /= shape_[axes[i]]) at[axes[i]] = rest % shape_[axes[i]];
    members.push_back(rank_at(at));
  }
  return members;
}

std::vector<std::vector<int>> mesh_layout::groups(std::string_view name) const {
  std::vector<std::vector<int>> all;
  std::vector<bool> placed(static_cast<std::size_t>(num_processes_), false);
  for (int rank = 0; rank < num_processes_; ++rank) {
    if (placed[static_cast<std::size_t>(rank)]) continue;
    all.push_back(group_of(name, rank));
    for (int member : all.back()) placed[static_cast<std::size_t>(member)] = true;
  }
  return all;
}

const mesh_dimension& mesh_layout::dimension(std::string_view name) const {
  if (const auto* found = find(name)) return *found;
  std::string names;
  for (const auto& dimension : dimensions_) detail::append_item(names, dimension.name);
  throw mesh_error("accel: the mesh (" + detail::describe(sizes_) + ") has no dimension \"" + std::string(name) +
                   "\"; it has " + (names.empty() ? std::string("none (one process)") : names) +
                   ". A dimension of size 1 is left out: give it a size > 1 to use it");
}

const mesh_dimension* mesh_layout::find(std::string_view name) const noexcept {
  for (const auto& dimension : dimensions_)
    if (dimension.name == name) return &dimension;
  return nullptr;
}

void mesh_layout::flatten(std::string name, std::initializer_list<std::string_view> parts) {
  mesh_dimension flattened{std::move(name), {}};
  for (auto part : parts)
    if (const auto* dimension = find(part)) flattened.axes.push_back(dimension->axes.front());
  if (!flattened.axes.empty()) dimensions_.push_back(std::move(flattened));
}

int mesh_layout::rank_at(const std::vector<int>& coordinates) const {
  int rank = 0;
  for (std::size_t axis = 0; axis < shape_.size(); ++axis) rank = rank * shape_[axis] + coordinates[axis];
  return rank;
}

void mesh_layout::check_rank(int rank) const {
  if (rank < 0 || rank >= num_processes_)
    throw mesh_error("accel: rank " + std::to_string(rank) + " is not in the mesh's job of " +
                     std::to_string(num_processes_) + " processes (ranks 0 to " + std::to_string(num_processes_ - 1) +
                     ")");
}

std::optional<mesh_layout> parallelism_config_from_environment(int num_processes) {
  if (!parallelism_config_in_environment()) return std::nullopt;
  return mesh_layout(mesh_sizes_from_environment(), num_processes);
}

std::optional<mesh_layout> configured_mesh(const parallelism_options& given, int num_processes) {
  const auto& entries = detail::mesh_size_variables;
  if (std::none_of(entries.begin(), entries.end(), [&](const auto& entry) { return (given.*entry.given).has_value(); }))
    return parallelism_config_from_environment(num_processes);
  auto sizes = mesh_sizes_from_environment();
  for (const auto& entry : entries)
    if (const auto& size = given.*entry.given) sizes.*entry.size = *size;
  return mesh_layout(sizes, num_processes);
}

cp_comm_strategy configured_cp_comm_strategy(const parallelism_options& given) {
  if (given.cp_comm_strategy) return *given.cp_comm_strategy;
  const char* set = std::getenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY");
  const std::string_view value = set == nullptr ? "" : set;
  if (value.empty() || value == "allgather") return cp_comm_strategy::allgather;
  if (value == "alltoall") return cp_comm_strategy::alltoall;
  throw mesh_error("accel: PARALLELISM_CONFIG_CP_COMM_STRATEGY is \"" + std::string(value) +
                   "\"; context parallelism's rotations are \"allgather\" (the default) and \"alltoall\"");
}

}  // namespace accel
