/// \file
/// What checkpoint.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../checkpoint.hpp"

#include "../detail/checkpoint/accelerate_format.hpp"
#include "../detail/checkpoint/python_optimizer.hpp"
#include "../detail/support/directory_entries.hpp"

namespace accel {

std::vector<std::filesystem::path> merge_weights(const std::filesystem::path& checkpoint,
                                                 const std::filesystem::path& out,
                                                 const merge_weights_options& options) {
  if (!std::filesystem::is_directory(checkpoint))
    throw checkpoint_error("accel::merge_weights: no checkpoint at " + checkpoint.string());
  const auto below = std::filesystem::weakly_canonical(out).lexically_relative(std::filesystem::canonical(checkpoint));
  if (options.remove_checkpoint_dir && !below.empty() && *below.begin() != "..")
    throw checkpoint_error(
        "accel::merge_weights: remove_checkpoint_dir (--remove_checkpoint_dir) would delete the "
        "merged weights too: " +
        out.string() + " is inside the checkpoint " + checkpoint.string() + "; write them to a directory outside it");
  const auto manifest = detail::read_manifest(checkpoint);
  if (!manifest) throw detail::unchecked_checkpoint(checkpoint, "accel::merge_weights");
  auto shared = detail::read_archive(checkpoint, std::string(detail::checkpoint_files::accel_state), manifest);
  c10::IValue models;
  if (!shared.try_read("models", models) || !models.isInt() || models.toInt() < 0)
    throw checkpoint_error("accel::merge_weights: " + (checkpoint / detail::checkpoint_files::accel_state).string() +
                           " lacks the number of models (a damaged file?)");
  const auto sharded = detail::shard_layout_table::load(checkpoint, manifest);
  std::filesystem::create_directories(out);
  // The pickled file needs the weights whole in memory: a sharded checkpoint's are merged into a file beside the
  // output first (one tensor at a time, as for safetensors), read back, and that file removed.
  const auto whole = [&](std::size_t i) {
    if (!sharded) return detail::read_model_weights(checkpoint, i, manifest).first;
    const auto merging = out / ("." + detail::checkpoint_files::model(i, true) + ".merging");
    detail::write_merged_model(checkpoint, *manifest, *sharded, i, merging);
    auto tensors = safetensors::load(merging);
    std::filesystem::remove(merging);
    return tensors;
  };
  std::vector<std::filesystem::path> written;
  for (std::size_t i = 0; i < static_cast<std::size_t>(models.toInt()); ++i) {
    const auto name = detail::checkpoint_files::model(i, options.safe_serialization);
    if (!options.safe_serialization) {
      auto tensors = detail::python_dict();  // torch.save's plain dict, which torch.load(weights_only=True) reads
      for (const auto& [tensor_name, tensor] : whole(i)) tensors.insert(tensor_name, tensor);
      detail::write_torch_save(c10::IValue(tensors), out, name);
    } else if (sharded)
      detail::write_merged_model(checkpoint, *manifest, *sharded, i, out / name);                // one tensor at a time
    else if (!detail::rewrite_full_model(checkpoint, *manifest, i, out / name))                  // likewise
      safetensors::save(out / name, detail::read_model_weights(checkpoint, i, manifest).first);  // pickled: whole
    written.push_back(out / name);
  }
  if (options.remove_checkpoint_dir) detail::remove_tree(checkpoint);  // as Accelerate does, once all is written
  return written;
}

}  // namespace accel
