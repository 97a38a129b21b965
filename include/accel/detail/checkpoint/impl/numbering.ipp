/// \file
/// What numbering.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../numbering.hpp"

namespace accel::detail {

void count_from_loaded(checkpoint_settings& settings, const std::filesystem::path& directory) {
  auto path = std::filesystem::absolute(directory).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  const auto number = checkpoint_number(path.filename().string());
  std::error_code error;
  if (!number || *number == std::numeric_limits<std::int64_t>::max() ||
      !std::filesystem::equivalent(path.parent_path(), checkpoints_root(settings.project), error))
    return;
  const auto existing = numbered_checkpoints(path.parent_path());
  auto next = *number + 1;
  for (auto found = existing.find(next); found != existing.end() && !is_complete_checkpoint(found->second);
       found = existing.find(++next)) {
  }
  settings.next_number = next;
}

std::int64_t next_checkpoint_number(const checkpoint_settings& settings) {
  if (settings.next_number) return *settings.next_number;
  const auto existing = numbered_checkpoints(checkpoints_root(settings.project));
  if (existing.empty()) return 0;
  if (existing.rbegin()->first == std::numeric_limits<std::int64_t>::max())
    throw checkpoint_error("accel::save_state(): " + existing.rbegin()->second.string() +
                           " has the largest number a checkpoint can have; move the checkpoints away to go on");
  return existing.rbegin()->first + 1;
}

std::optional<std::filesystem::path> newest_complete_checkpoint(const project_options& project) {
  const auto existing = numbered_checkpoints(checkpoints_root(project));
  for (auto it = existing.rbegin(); it != existing.rend(); ++it)
    if (is_complete_checkpoint(it->second)) return it->second;
  return std::nullopt;
}

std::string processes_lacking(const std::vector<std::set<std::int64_t>>& everywhere, std::int64_t number) {
  std::string list;
  for (std::size_t r = 0; r < everywhere.size(); ++r)
    if (!everywhere[r].contains(number)) append_item(list, std::to_string(r));
  return (list.find(',') == std::string::npos ? "process " : "processes ") + list;
}

}  // namespace accel::detail
