/// \file
/// The project's automatic checkpoints, `{project_dir}/checkpoints/checkpoint_{i}`: which number the next save
/// takes (the same on every process), and which checkpoint is the newest complete one.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "../../collectives.hpp"
#include "agreement.hpp"
#include "directory.hpp"
#include "format.hpp"
#include "settings.hpp"
#include "../support/text.hpp"

namespace accel::detail {

/// `{project_dir}/checkpoints`, where the automatic checkpoints go.
inline std::filesystem::path checkpoints_root(const project_options& project) {
  return std::filesystem::path(project.project_dir) / "checkpoints";
}

/// Whether `directory` holds a checkpoint whose save completed (its manifest is written last).
inline bool is_complete_checkpoint(const std::filesystem::path& directory) {
  return std::filesystem::is_regular_file(directory / checkpoint_files::manifest);
}

/// After `load_state(directory)`: when `directory` is the project's `checkpoint_{k}`, the next automatic save is
/// `checkpoint_{k + 1}` (Accelerate's), or the first number after it that no incomplete checkpoint holds: a save cut
/// short (a crash, a full disk) left it, and numbering onto it would refuse every later save, so it stays as it is,
/// passed over. A complete checkpoint there is still refused at the save: loading an older one is a choice.
ACCEL_DECL void count_from_loaded(checkpoint_settings& settings, const std::filesystem::path& directory);

/// The number the next `save_state()` writes, as this process sees it: the one fixed (`project.iteration`, then the
/// number after each automatic save, or after the `checkpoint_{k}` loaded), else one above the highest
/// `checkpoint_{i}` under the project's checkpoints directory (0 when there is none).
ACCEL_DECL std::int64_t next_checkpoint_number(const checkpoint_settings& settings);

/// The number of the next automatic checkpoint, the same on every process (a collective): the largest of the
/// processes' own (machines that do not share a disk may count differently: after a resume, one passes over a save
/// cut short that another does not have); when the number is fixed (`project.iteration`, or counted on from a
/// checkpoint), refused on every process when a process sees its directory already.
template <class Parallel>
std::int64_t agree_on_checkpoint_number(const checkpoint_settings& settings, Parallel& parallel) {
  std::int64_t next = 0;
  on_every_process_or_none(parallel, "save_state", "choosing the checkpoint's number",
                           [&] { next = next_checkpoint_number(settings); });
  if (parallel.num_processes() > 1) {
    auto&& comm = parallel.communicator();
    next = reduce(comm, at::full({1}, next, at::kLong), reduction::max).template item<std::int64_t>();
  }
  on_every_process_or_none(parallel, "save_state", "choosing the checkpoint's number", [&] {
    const auto directory = checkpoints_root(settings.project) / ("checkpoint_" + std::to_string(next));
    if (settings.next_number && std::filesystem::exists(std::filesystem::symlink_status(directory)))
      throw checkpoint_error("accel::save_state(): " + directory.string() + " already exists (save_iteration() is " +
                             std::to_string(next) +
                             "): an automatic save never replaces a checkpoint; move it away, or number on from "
                             "another checkpoint with acc.set_save_iteration(n) (options::project.iteration at start)");
  });
  return next;
}

/// The project's newest complete automatic checkpoint (one with its manifest: a directory whose removal beyond
/// `total_limit` was cut short is passed over), if any.
ACCEL_DECL std::optional<std::filesystem::path> newest_complete_checkpoint(const project_options& project);

/// The numbers of the complete automatic checkpoints each process sees, gathered from every process (a collective:
/// machines that do not share a disk see different ones). A process that cannot list its directory fails every one.
template <class Parallel>
std::vector<std::set<std::int64_t>> complete_checkpoints_everywhere(const project_options& project,
                                                                    Parallel& parallel) {
  std::vector<char> mine;
  on_every_process_or_none(parallel, "load_state", "looking for the newest checkpoint", [&] {
    for (const auto& [number, directory] : numbered_checkpoints(checkpoints_root(project)))
      if (is_complete_checkpoint(directory)) {
        const auto* bytes = reinterpret_cast<const char*>(&number);
        mine.insert(mine.end(), bytes, bytes + sizeof number);
      }
  });
  auto&& comm = parallel.communicator();
  std::vector<std::set<std::int64_t>> everywhere;
  for (const auto& bytes : all_gather_bytes(comm, mine)) {
    auto& numbers = everywhere.emplace_back();
    for (std::size_t at = 0; at + sizeof(std::int64_t) <= bytes.size(); at += sizeof(std::int64_t)) {
      std::int64_t number = 0;
      std::memcpy(&number, bytes.data() + at, sizeof number);
      numbers.insert(number);
    }
  }
  return everywhere;
}

/// The processes (as "processes 2, 3") whose complete checkpoints lack `number`.
ACCEL_DECL std::string processes_lacking(const std::vector<std::set<std::int64_t>>& everywhere, std::int64_t number);

/// The newest automatic checkpoint complete on every process, decided together (a collective), or none when no
/// process has one. Each process alone would pick the newest it sees, and processes loading different checkpoints
/// (or one loading none) fail at their first collective. A newer one that some processes lack is passed over, the
/// main process says so; when some process has one but none is complete on every process, every process throws
/// `checkpoint_error`, naming it, the processes lacking it and the fix: never training from scratch silently.
template <class Parallel>
std::optional<std::filesystem::path> agreed_newest_checkpoint(const project_options& project, Parallel& parallel) {
  if (parallel.num_processes() == 1) return newest_complete_checkpoint(project);
  const auto everywhere = complete_checkpoints_everywhere(project, parallel);
  std::optional<std::int64_t> newest, common;
  for (const auto& numbers : everywhere)
    if (!numbers.empty()) newest = std::max(newest.value_or(*numbers.rbegin()), *numbers.rbegin());
  if (!newest) return std::nullopt;
  for (const auto number : everywhere.front())
    if (std::ranges::all_of(everywhere, [&](const auto& numbers) { return numbers.contains(number); })) common = number;
  const auto name = [](std::int64_t number) { return "checkpoint_" + std::to_string(number); };
  const auto root = checkpoints_root(project);
  const auto lacking = name(*newest) + " under " + root.string() + " is missing or incomplete on " +
                       processes_lacking(everywhere, *newest) +
                       " (machines that do not share a disk each see their own)";
  if (!common)
    throw checkpoint_error("accel: resume::latest / load_state(): no checkpoint is complete on every process; " +
                           lacking +
                           ". Save with options::project.save_on_each_node = true, or put project_dir on "
                           "a disk every machine shares, or copy " +
                           name(*newest) + " to the others' disks");
  if (*common != *newest && parallel.process_index() == 0)
    std::cerr << "accel: resume::latest / load_state(): loading " << name(*common)
              << ", the newest checkpoint complete on every process: " << lacking
              << "; the next automatic save refuses to replace a newer checkpoint on any process: move those away\n";
  return root / name(*common);
}
/// The same, throwing when there is none (`load_state()`).
template <class Parallel>
std::filesystem::path newest_checkpoint(const project_options& project, Parallel& parallel) {
  if (auto newest = agreed_newest_checkpoint(project, parallel)) return *newest;
  throw checkpoint_error("accel::load_state(): no complete checkpoint_{i} under " + checkpoints_root(project).string());
}

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/numbering.ipp"
#endif
