/// \file
/// `checkpoint_reader`: the read and check steps of a load. Everything a checkpoint holds for this process is read
/// and checked against the program (the files against the manifest, the number of processes and of each kind of
/// object, every weight's name, shape and dtype, every generator state) into a `checkpoint_contents`, before anything
/// of the program changes; checkpoint_io.hpp then applies it.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "../../model_weights.hpp"
#include "../compat.hpp"
#include "../prepared/registry.hpp"
#include "../support/generators.hpp"
#include "../support/text.hpp"
#include "agreement.hpp"
#include "archives.hpp"
#include "format.hpp"
#include "manifest.hpp"
#include "rank_local.hpp"
#include "settings.hpp"
#include "sharded_format.hpp"

namespace accel::detail {

/// Which `random_states_{i}.bin` a process reads: its own, when the checkpoint was written by as many processes.
/// Written by another number, the data positions and the policies' state (the same on every process, so the main
/// process's is everyone's, each range converting its position: prepared_range.hpp) come from process 0's file,
/// and each process that had a counterpart takes that one's generators; the others keep their own.
struct process_files {
  int state = 0;
  std::optional<int> generators;
};
ACCEL_DECL process_files process_files_to_read(std::int64_t saved_processes, int process, int processes);

/// Every generator state in `states` fits its generator: tried on a copy of it, so that nothing changes.
ACCEL_DECL void check_generator_states(const std::vector<std::pair<at::Generator, at::Tensor>>& states,
                                       const std::string& file);

/// What a load applies, read and checked: nothing of the program has changed yet.
struct checkpoint_contents {
  /// Each model's weights by name, as this process holds them (rank_local.hpp): whole, or its slice (flat) of
  /// those `sliced_weights` names. Of safetensors files the manifest lists, where their bytes lie (`weight_reads`,
  /// read by `ranged` straight into the weights once nothing else of the load can fail); of other files, read.
  std::vector<std::map<std::string, at::Tensor>> weights;
  std::vector<std::map<std::string, planned_read>> weight_reads;
  std::vector<std::set<std::string>> sliced_weights;
  std::optional<ranged_reader> ranged;
  /// Each optimizer's archive (its options; its full state in the full format) and, in the sharded format, its
  /// state by field as this process holds it: its slice of each parameter the policy shards.
  std::vector<torch::serialize::InputArchive> optimizer_archives;
  std::vector<std::map<std::string, at::Tensor>> optimizer_states;
  /// Each slot's archive, by kind, in registration order.
  std::map<std::string, std::vector<torch::serialize::InputArchive>> slot_archives;
  /// The `random_states_{i}.bin` the policies' state comes from, and its archive.
  std::string process_file;
  torch::serialize::InputArchive process_state;
  /// The generators' states to set, checked.
  std::vector<std::pair<at::Generator, at::Tensor>> generator_states;
  bool sharded = false;
};

/// The models a load fills: every prepared model, less those the load_state pre-hooks, run on every process in
/// registration order, removed (to load them themselves). A sharded checkpoint's shards load into every model, so
/// there the hooks get none (as Accelerate's do under FSDP). With hooks, one all-reduce: a hook that throws fails
/// the load on every process, before anything is read.
template <class Parallel>
std::vector<std::shared_ptr<torch::nn::Module>> hooked_models(Parallel& parallel, const prepared_registry& registry,
                                                              const checkpoint_settings& settings,
                                                              const std::filesystem::path& directory) {
  if (settings.load_hooks.empty()) return registry.models();
  const bool sharded = std::filesystem::exists(directory / checkpoint_files::shard_layout);
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  if (!sharded) models = registry.models();
  on_every_process_or_none(parallel, "load_state", "running the load_state pre-hooks", [&] {
    settings.load_hooks.run(models, directory);
    if (sharded && !models.empty())
      throw checkpoint_error("accel::load_state: a load_state pre-hook added models, but " + directory.string() +
                             " is in the sharded format, whose shards load into every prepared model: the hooks get "
                             "no models to change");
  });
  return sharded ? registry.models() : models;
}

/// Reads the checkpoint in `directory` for this process into `models` (what the load_state pre-hooks left; `hooked`:
/// there are such hooks) and the registry's optimizers and slots; the optimizers' state is read to `read_to`.
class checkpoint_reader {
 public:
  ACCEL_DECL checkpoint_reader(const std::filesystem::path& directory, const prepared_registry& registry, int process,
                               int processes, const c10::Device& read_to, bool allow_unchecked = false,
                               held_parts parts = {});

  /// Every file comes from one checkpoint: a save that replaced the directory while it was read (its staging
  /// directory exchanged with it, the old files then removed) makes the read fail or mix two checkpoints, which the
  /// manifest's checksums catch; then the directory is read again, as it is now. A failure while the directory
  /// stayed the same is the checkpoint's own.
  ACCEL_DECL checkpoint_contents read(const std::vector<std::shared_ptr<torch::nn::Module>>& models, bool hooked);

 private:
  static constexpr int max_attempts = 5;

  /// What a save that replaces the checkpoint changes: the directory's inode (saves exchange it with their staging
  /// directory, so it alternates between two) and its manifest's (each save writes a new file), with their devices.
  [[nodiscard]] ACCEL_DECL std::array<std::uint64_t, 4> identity() const;

  ACCEL_DECL checkpoint_contents read_once(const std::vector<std::shared_ptr<torch::nn::Module>>& models, bool hooked);

  /// `accel_state.bin`'s counts against the program's: the same number of models (`models`), optimizers and slots
  /// of each kind, and no other kind. Returns which process files this process reads.
  ACCEL_DECL process_files check_counts(std::size_t models, bool hooked);

  /// Each model's weights, checked against it, as this process holds them (`parts_`): of safetensors files listed
  /// in the manifest (a sharded checkpoint's, a full one's model.safetensors), only those byte ranges will be read
  /// (rank_local.hpp), the files read whole checked now; a pickled model file, or one without a manifest, is read
  /// whole. A sharded checkpoint's optimizer states are read now, in ranges likewise.
  ACCEL_DECL void read_weights(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                               checkpoint_contents& contents);

  /// Each slot's archive: a shared slot's file, or a per-process slot's key in this process's file.
  ACCEL_DECL void read_slots(checkpoint_contents& contents);

  /// The generator states of process `from`'s file (this process's own, or its counterpart's), checked.
  ACCEL_DECL void read_generators(int from, int state_file, checkpoint_contents& contents);

  bool allow_unchecked_;
  held_parts parts_;
  std::filesystem::path directory_;
  int process_;
  int processes_;
  c10::Device read_to_;
  std::size_t optimizers_;
  std::map<std::string, std::vector<std::shared_ptr<checkpoint_slot>>> slots_;
  std::optional<checkpoint_manifest> manifest_;
  std::optional<shard_layout_table> sharded_;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/reader.ipp"
#endif
