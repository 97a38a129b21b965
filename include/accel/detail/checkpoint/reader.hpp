/// \file
/// `checkpoint_reader`: the read and check steps of a load. Everything a checkpoint holds for this process is read
/// and checked against the program (the files against the manifest, the number of processes and of each kind of
/// object, every weight's name, shape and dtype, every generator state) into a `checkpoint_contents`, before anything
/// of the program changes; training_state.hpp then applies it.
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
inline process_files process_files_to_read(std::int64_t saved_processes, int process, int processes) {
  if (saved_processes < 1)
    throw checkpoint_error("accel::load_state: " + std::string(checkpoint_files::accel_state) + " says " +
                           std::to_string(saved_processes) + " processes wrote the checkpoint (a damaged file?)");
  if (saved_processes == processes) return {process, process};
  return {0, process < saved_processes ? std::optional<int>(process) : std::nullopt};
}

/// Every generator state in `states` fits its generator: tried on a copy of it, so that nothing changes.
inline void check_generator_states(const std::vector<std::pair<at::Generator, at::Tensor>>& states,
                                   const std::string& file) {
  for (const auto& [generator, state] : states) try {
      compat::check_generator_state(generator, state);
    } catch (const std::exception& e) {
      throw checkpoint_error("accel::load_state: " + file + " holds a damaged " + generator.device().str() +
                             " generator state (" + first_line(e.what()) + "); nothing was loaded");
    }
}

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
  checkpoint_reader(const std::filesystem::path& directory, const prepared_registry& registry, int process,
                    int processes, const c10::Device& read_to, bool allow_unchecked = false, held_parts parts = {})
      : allow_unchecked_(allow_unchecked),
        parts_(std::move(parts)),
        directory_(directory),
        process_(process),
        processes_(processes),
        read_to_(read_to),
        optimizers_(registry.optimizers().size()),
        slots_(registry.slots_by_kind()) {}

  /// Every file comes from one checkpoint: a save that replaced the directory while it was read (its staging
  /// directory exchanged with it, the old files then removed) makes the read fail or mix two checkpoints, which the
  /// manifest's checksums catch; then the directory is read again, as it is now. A failure while the directory
  /// stayed the same is the checkpoint's own.
  checkpoint_contents read(const std::vector<std::shared_ptr<torch::nn::Module>>& models, bool hooked) {
    for (int attempt = 1;; ++attempt) {
      const auto before = identity();
      try {
        return read_once(models, hooked);
      } catch (const checkpoint_error&) {
        if (attempt == max_attempts || identity() == before) throw;
      }
    }
  }

 private:
  static constexpr int max_attempts = 5;

  /// What a save that replaces the checkpoint changes: the directory's inode (saves exchange it with their staging
  /// directory, so it alternates between two) and its manifest's (each save writes a new file), with their devices.
  [[nodiscard]] std::array<std::uint64_t, 4> identity() const {
    const auto of = [](const std::filesystem::path& path) {
      struct stat status{};
      return ::stat(path.c_str(), &status) == 0 ? std::pair<std::uint64_t, std::uint64_t>(status.st_dev, status.st_ino)
                                                : std::pair<std::uint64_t, std::uint64_t>(0, 0);
    };
    const auto directory = of(directory_), manifest = of(directory_ / checkpoint_files::manifest);
    return {directory.first, directory.second, manifest.first, manifest.second};
  }

  checkpoint_contents read_once(const std::vector<std::shared_ptr<torch::nn::Module>>& models, bool hooked) {
    if (!std::filesystem::is_directory(directory_))
      throw checkpoint_error("accel::load_state: no checkpoint at " + directory_.string());
    manifest_ = read_manifest(directory_);
    if (!manifest_ && std::filesystem::exists(directory_ / checkpoint_files::shard_layout))
      throw sharded_without_manifest(directory_);  // before any file of it is parsed
    if (!manifest_ && !allow_unchecked_) throw unchecked_checkpoint(directory_, "accel::load_state");
    const auto files = check_counts(models.size(), hooked);
    checkpoint_contents contents;
    read_weights(models, contents);
    contents.process_file = checkpoint_files::process(files.state);
    contents.process_state = read_archive(directory_, contents.process_file, manifest_);
    for (std::size_t i = 0; i < optimizers_; ++i)
      contents.optimizer_archives.push_back(
          read_archive(directory_, checkpoint_files::optimizer(i), manifest_, read_to_));
    read_slots(contents);
    if (files.generators) read_generators(*files.generators, files.state, contents);
    return contents;
  }

  /// `accel_state.bin`'s counts against the program's: the same number of models (`models`), optimizers and slots
  /// of each kind, and no other kind. Returns which process files this process reads.
  process_files check_counts(std::size_t models, bool hooked) {
    auto shared = read_archive(directory_, std::string(checkpoint_files::accel_state), manifest_);
    const auto count = [&](const std::string& key) {
      c10::IValue value;
      if (!shared.try_read(key, value) || !value.isInt())
        throw checkpoint_error("accel::load_state: " + (directory_ / checkpoint_files::accel_state).string() +
                               " lacks \"" + key + "\"");
      return value.toInt();
    };
    const auto expect = [&](const std::string& key, std::size_t mine) {
      if (count(key) != static_cast<std::int64_t>(mine))
        throw checkpoint_error("accel::load_state: the checkpoint in " + directory_.string() + " has " +
                               std::to_string(count(key)) + " " + key + ", this program " + std::to_string(mine) +
                               (key == "models" && hooked ? " after its load_state pre-hooks (which must remove the "
                                                            "models whose weights its save_state pre-hooks removed)"
                                                          : "") +
                               "; prepare the same objects, in the same order, as when saving");
    };
    const auto files = process_files_to_read(count("processes"), process_, processes_);
    expect("models", models);
    expect("optimizers", optimizers_);
    for (const auto& [kind, list] : slots_) expect(kind, list.size());
    for (const auto& key : shared.keys())
      if (key != "processes" && key != "models" && key != "optimizers" && !slots_.contains(key))
        expect(key, 0);  // the checkpoint holds objects of a kind this program did not prepare
    sharded_ = shard_layout_table::load(directory_, manifest_);
    if (sharded_ && (sharded_->processes != count("processes") || sharded_->models.size() != models))
      throw checkpoint_error("accel::load_state: " + (directory_ / checkpoint_files::shard_layout).string() +
                             " does not match " + std::string(checkpoint_files::accel_state) +
                             " (a damaged checkpoint?)");
    return files;
  }

  /// Each model's weights, checked against it, as this process holds them (`parts_`): of safetensors files listed
  /// in the manifest (a sharded checkpoint's, a full one's model.safetensors), only those byte ranges will be read
  /// (rank_local.hpp), the files read whole checked now; a pickled model file, or one without a manifest, is read
  /// whole. A sharded checkpoint's optimizer states are read now, in ranges likewise.
  void read_weights(const std::vector<std::shared_ptr<torch::nn::Module>>& models, checkpoint_contents& contents) {
    contents.sharded = sharded_.has_value();
    auto& ranged = contents.ranged;
    if (manifest_) ranged.emplace(directory_, *manifest_);
    for (std::size_t i = 0; i < models.size(); ++i) {
      const auto what = [&](const std::string& name) {
        return "accel::load_state: the weights in " + (directory_ / name).string() + " do not fit the prepared model";
      };
      const auto full_name = checkpoint_files::model(i, true);
      if (sharded_ || (ranged && manifest_->files().contains(full_name))) {
        auto held = sharded_
                        ? read_held_shards(*ranged, *sharded_, i, parts_, *models[i],
                                           what(checkpoint_files::shard(checkpoint_files::kind::model, i, 0)))
                        : read_held_files(*ranged, {ranged->open(full_name)}, i, parts_, *models[i], what(full_name));
        contents.weights.emplace_back();
        contents.weight_reads.push_back(std::move(held.reads));
        contents.sliced_weights.push_back(std::move(held.sliced));
        continue;
      }
      auto [loaded, name] = read_model_weights(directory_, i, manifest_);
      contents.weights.emplace_back(loaded.begin(), loaded.end());
      contents.weight_reads.emplace_back();
      check_weights_fit(whole_state_of(*models[i], i, parts_), contents.weights.back(), what(name));
      contents.sliced_weights.push_back(keep_held_slices(contents.weights.back(), i, parts_));
    }
    for (std::size_t i = 0; sharded_ && i < optimizers_; ++i)
      contents.optimizer_states.push_back(read_held_optimizer_state(*ranged, *sharded_, i, parts_));
    if (ranged) ranged->check_whole_files();
    for (auto& states : contents.optimizer_states)
      for (auto& [name, tensor] : states) tensor = tensor.to(read_to_);  // map_location
  }

  /// Each slot's archive: a shared slot's file, or a per-process slot's key in this process's file.
  void read_slots(checkpoint_contents& contents) {
    for (const auto& [kind, list] : slots_)
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (list[i]->scope == state_scope::shared) {
          contents.slot_archives[kind].push_back(read_archive(directory_, checkpoint_files::slot(kind, i), manifest_));
          continue;
        }
        contents.slot_archives[kind].emplace_back();
        if (!contents.process_state.try_read(checkpoint_files::slot_key(kind, i), contents.slot_archives[kind].back()))
          throw checkpoint_error("accel::load_state: " + contents.process_file + " lacks " + kind + " " +
                                 std::to_string(i) + "'s position (saved by another configuration?)");
      }
  }

  /// The generator states of process `from`'s file (this process's own, or its counterpart's), checked.
  void read_generators(int from, int state_file, checkpoint_contents& contents) {
    const auto file = checkpoint_files::process(from);
    std::optional<torch::serialize::InputArchive> other;
    auto& archive =
        from == state_file ? contents.process_state : other.emplace(read_archive(directory_, file, manifest_));
    for (auto& [key, generator] : generators()) {
      at::Tensor state;
      if (archive.try_read(key, state))
        contents.generator_states.emplace_back(generator, state);
      else if (key == "cpu_rng")
        throw checkpoint_error("accel::load_state: " + file + " lacks the CPU generator state");
    }
    check_generator_states(contents.generator_states, file);
  }

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
