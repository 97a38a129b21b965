/// \file
/// What writer.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../writer.hpp"

namespace accel::detail {

std::vector<std::string> process_file_names(int process, const prepared_registry& registry, bool sharded) {
  std::vector<std::string> names{checkpoint_files::process(process)};
  if (!sharded) return names;
  for (std::size_t i = 0; i < registry.models().size(); ++i)
    names.push_back(checkpoint_files::shard(checkpoint_files::kind::model, i, process));
  for (std::size_t i = 0; i < registry.optimizers().size(); ++i)
    names.push_back(checkpoint_files::shard(checkpoint_files::kind::optimizer, i, process));
  return names;
}

checkpoint_error unseen_directory(const std::filesystem::path& partial, int process, bool sharded) {
  return checkpoint_error(
      "accel::save_state: process " + std::to_string(process) + " does not see " + partial.string() + ", which " +
      (sharded ? "process 0 made: in the sharded format every process writes its shard files into the checkpoint, "
                 "so its directory must be on a file system every process sees"
               : "its machine's local main process made: with options::project.save_on_each_node the processes of a "
                 "machine must have local_process_index() 0 to local_world_size - 1 there, as accel launch and "
                 "torchrun number them"));
}

}  // namespace accel::detail
