/// \file
/// Saving and loading the training state: what `accelerator::save_state` and `load_state` do, through the
/// accelerator's `detail::training_state` (detail/checkpoint/training_state.hpp), which reads, checks and applies a
/// checkpoint (reader.hpp) and writes one atomically (writer.hpp); the files are named once (format.hpp) and
/// described in docs/checkpoint-format.md. Also `accel::merge_weights` (`accel merge-weights`), `map_location` and
/// the pre-hooks' types.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint_error.hpp"
#include "detail/checkpoint/archives.hpp"
#include "detail/checkpoint/format.hpp"
#include "detail/checkpoint/manifest.hpp"
#include "detail/checkpoint/settings.hpp"
#include "detail/checkpoint/sharded_format.hpp"
#include "detail/checkpoint/training_state.hpp"
#include "safetensors.hpp"

namespace accel {

/// Writes the full weights of the checkpoint in `checkpoint` into the directory `out` (made if need be):
/// `model.safetensors`, and `model_{i}.safetensors` for each further model, as a full checkpoint names them. From a
/// sharded checkpoint (`state_dict_type::sharded`) they are assembled from every process's shard files; a full
/// checkpoint's are read and written again. Every file read is checked against the checkpoint's manifest first.
/// Returns the files written. `accel merge-weights CHECKPOINT OUT` runs it (Accelerate's `merge-weights`).
inline std::vector<std::filesystem::path> merge_weights(const std::filesystem::path& checkpoint,
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
