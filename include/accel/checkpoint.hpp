/// \file
/// Saving and loading the training state: what `accelerator::save_state` and `load_state` do (they need this
/// header), through `detail::checkpoint_io` (detail/checkpoint/checkpoint_io.hpp), which reads, checks and applies a
/// checkpoint (reader.hpp) and writes one atomically (writer.hpp); the files are named once (format.hpp) and
/// described in docs/checkpoint-format.md. Also `accel::merge_weights` (`accel merge-weights`), `map_location` and
/// the pre-hooks' types.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "detail/config.hpp"
#include "checkpoint_error.hpp"
#include "detail/checkpoint/archives.hpp"
#include "detail/checkpoint/checkpoint_io.hpp"
#include "detail/checkpoint/format.hpp"
#include "detail/checkpoint/manifest.hpp"
#include "detail/checkpoint/settings.hpp"
#include "detail/checkpoint/sharded_format.hpp"
#include "detail/prepared/accelerator_access.hpp"
#include "safetensors.hpp"

namespace accel {

/// `merge_weights`' choices, those of Accelerate's `merge_fsdp_weights(checkpoint_dir, output_path,
/// safe_serialization, remove_checkpoint_dir)` and of its `merge-weights` command's flags.
struct merge_weights_options {
  /// The weights as safetensors (`model.safetensors`); false (`--unsafe_serialization`): PyTorch's pickled
  /// `pytorch_model.bin`, a dict of tensors that `torch.load` reads (whole in memory while it is written).
  bool safe_serialization = true;
  /// Remove the checkpoint directory once every file is written (`--remove_checkpoint_dir`). Refused, before anything
  /// is written, when `out` is inside it.
  bool remove_checkpoint_dir = false;
};

/// Writes the full weights of the checkpoint in `checkpoint` into the directory `out` (made if need be):
/// `model.safetensors`, and `model_{i}.safetensors` for each further model, as a full checkpoint names them
/// (`pytorch_model.bin`, `pytorch_model_{i}.bin` without `safe_serialization`). From a sharded checkpoint
/// (`state_dict_type::sharded`) they are assembled from every process's shard files; a full checkpoint's are read and
/// written again. Every file read is checked against the checkpoint's manifest first. Returns the files written.
/// `accel merge-weights [--unsafe_serialization] [--remove_checkpoint_dir] CHECKPOINT OUT` runs it (Accelerate's
/// `merge-weights`).
ACCEL_DECL std::vector<std::filesystem::path> merge_weights(const std::filesystem::path& checkpoint,
                                                            const std::filesystem::path& out,
                                                            const merge_weights_options& options = {});

/// Waits until the asynchronous save in flight (`save_options::asynchronous`) is complete on this process: the
/// directory it wrote; none when no save was in flight. A save that failed (on any process: they agree) raises its
/// `checkpoint_error` here, on every process that waits. Call it on every process, as the save.
template <class Accelerator>
std::optional<std::filesystem::path> wait_for_checkpoint(Accelerator& acc) {
  return detail::accelerator_access::finish_background_save(acc);
}

/// The accelerator saves and resumes by itself, into the project's numbered checkpoints
/// (`options::project.automatic_checkpoint_naming`): every `how.every_steps` optimizer steps a `save_state(how.save)`
/// once the step's batch is done, and with `resume::latest` the newest checkpoint complete on every process loads
/// when the first pass over a prepared range starts, so that a program restarted by `accel launch --max_restarts`
/// goes on mid-epoch. Accelerate leaves both to the loop. Call it on every process, before the training loop. A
/// loop that does not call it compiles none of the checkpoint code.
template <class Accelerator>
void checkpoint_automatically(Accelerator& acc, const automatic_checkpoint_options& how) {
  detail::accelerator_access::plan_checkpoints(acc, how);
}

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/checkpoint.ipp"
#endif
