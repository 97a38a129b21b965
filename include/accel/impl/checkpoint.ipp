/// \file
/// What checkpoint.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../checkpoint.hpp"

namespace accel {

std::vector<std::filesystem::path> merge_weights(const std::filesystem::path& checkpoint,
                                                 const std::filesystem::path& out) {
  if (!std::filesystem::is_directory(checkpoint))
    throw checkpoint_error("accel::merge_weights: no checkpoint at " + checkpoint.string());
  const auto manifest = detail::read_manifest(checkpoint);
  if (!manifest) throw detail::unchecked_checkpoint(checkpoint, "accel::merge_weights");
  auto shared = detail::read_archive(checkpoint, std::string(detail::checkpoint_files::accel_state), manifest);
  c10::IValue models;
  if (!shared.try_read("models", models) || !models.isInt() || models.toInt() < 0)
    throw checkpoint_error("accel::merge_weights: " + (checkpoint / detail::checkpoint_files::accel_state).string() +
                           " lacks the number of models (a damaged file?)");
  const auto sharded = detail::shard_layout_table::load(checkpoint, manifest);
  std::filesystem::create_directories(out);
  std::vector<std::filesystem::path> written;
  for (std::size_t i = 0; i < static_cast<std::size_t>(models.toInt()); ++i) {
    const auto name = detail::checkpoint_files::model(i, true);
    if (sharded)
      detail::write_merged_model(checkpoint, *manifest, *sharded, i, out / name);                // one tensor at a time
    else if (!detail::rewrite_full_model(checkpoint, *manifest, i, out / name))                  // likewise
      safetensors::save(out / name, detail::read_model_weights(checkpoint, i, manifest).first);  // pickled: whole
    written.push_back(out / name);
  }
  return written;
}

}  // namespace accel
