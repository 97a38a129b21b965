/// \file
/// `checkpoint_writer`: one save of a checkpoint into its directory, atomically. Every process writes its part into
/// the locked staging directory `DIR.partial` (directory.hpp), the writers add the manifest of sizes and checksums,
/// and the staging directory replaces the old checkpoint, keeping what accel did not write. Each step is agreed on by
/// every process (agreement.hpp), so that a failure anywhere fails the save everywhere and leaves the previous
/// checkpoint as it was. What each process holds of its own (its generators, its policies' state) reaches the writer
/// as bytes: the writer knows the files, not the participants (training_state.hpp).
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <ATen/ATen.h>
#include <torch/serialize/output-archive.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "../../collectives.hpp"
#include "../../model_weights.hpp"
#include "../../safetensors.hpp"
#include "../prepared/registry.hpp"
#include "../support/atomic_file.hpp"
#include "../support/crc32c.hpp"
#include "../support/scope.hpp"
#include "agreement.hpp"
#include "archives.hpp"
#include "directory.hpp"
#include "format.hpp"
#include "manifest.hpp"
#include "settings.hpp"
#include "sharded_format.hpp"

namespace accel::detail {

using slot_map = std::map<std::string, std::vector<std::shared_ptr<checkpoint_slot>>>;

/// How a checkpoint is written: the sharded format (each process its slices) or the full one (the weights full),
/// and whether the full format's model files are safetensors or Accelerate's pickled `pytorch_model.bin`.
struct checkpoint_layout {
  bool sharded = false;
  bool safe_serialization = true;
};

/// The files each process writes of its own, in order: its `random_states_{rank}.bin`, then in a sharded checkpoint
/// its shard of each model and of each optimizer.
ACCEL_DECL std::vector<std::string> process_file_names(int process, const prepared_registry& registry, bool sharded);

/// What a process that does not see the staging directory its writer made is told, where it must see it.
ACCEL_DECL checkpoint_error unseen_directory(const std::filesystem::path& partial, int process, bool sharded);

/// One save of the prepared objects of `registry` into a directory, by every process (a collective).
template <class Parallel>
class checkpoint_writer {
 public:
  checkpoint_writer(Parallel& parallel, const prepared_registry& registry, const checkpoint_settings& settings,
                    checkpoint_layout layout)
      : parallel_(parallel),
        registry_(registry),
        settings_(settings),
        layout_(layout),
        slots_(registry.slots_by_kind()),
        writer_(writes_shared_files(settings.project, parallel)) {}

  /// Writes the checkpoint into `directory`; `own_state()` gives this process's `random_states_{rank}.bin`.
  template <class OwnState>
  void write(const std::filesystem::path& directory, OwnState&& own_state) {
    check_request();
    const auto target = checkpoint_directory(directory);
    const auto partial = std::filesystem::path(target.string() + ".partial");
    const auto weights = hooked_weights(directory);
    const auto discard_on_failure = scope_fail([this] {
      if (staging_) staging_->discard();
    });
    open_staging(target, partial);
    on_every_process_or_none(parallel_, "save_state", "writing its part of the checkpoint",
                             [&] { write_parts(partial, own_state(), weights); });
    write_unseen_files(partial);
    gather_process_files();
    on_every_process_or_none(parallel_, "save_state", "putting " + target.string() + " in place", [&] {
      if (!writer_) return;
      write_atomically<checkpoint_error>(partial / checkpoint_files::manifest,
                                         [&](auto& out) { out.write(manifest_.text()); });
      staging_->install();
    });
  }

 private:
  /// Refused on every process alike, before any collective: objects that cannot be saved, and a format the
  /// settings rule out.
  void check_request() const {
    for (const auto& [kind, list] : slots_)
      for (std::size_t i = 0; i < list.size(); ++i)
        if (!list[i]->save)
          throw checkpoint_error("accel::save_state: " + kind + " " + std::to_string(i) +
                                 " cannot be checkpointed: give it save(OutputArchive&) const and load(InputArchive&)");
    if (layout_.sharded && settings_.project.save_on_each_node)
      throw checkpoint_error(
          "accel::save_state: options::project.save_on_each_node writes a whole checkpoint on each machine, which the "
          "sharded format (options::sharding.state_dict = state_dict_type::sharded) cannot: each process writes only "
          "its own shards; use state_dict_type::full with save_on_each_node, or a file system every machine sees");
  }

  /// The weights the full format writes: each model's parameters and buffers by name (none in the sharded format,
  /// where each process writes its shards of every model), as the save_state pre-hooks, run on every process in
  /// registration order, left them. A hook that throws fails the save on every process before anything is written.
  std::vector<safetensors::tensor_list> hooked_weights(const std::filesystem::path& directory) const {
    std::vector<safetensors::tensor_list> weights;
    for (std::size_t i = 0; !layout_.sharded && i < registry_.models().size(); ++i)
      weights.push_back(state_of(*registry_.models()[i]));
    on_every_process_or_none(parallel_, "save_state", "running the save_state pre-hooks", [&] {
      settings_.save_hooks.run(registry_.models(), weights, directory);
      if (layout_.sharded && !weights.empty())
        throw checkpoint_error(
            "accel::save_state: a save_state pre-hook added weights, but in the sharded format "
            "(options::sharding.state_dict = state_dict_type::sharded) every process writes its shards of every "
            "model and the hooks get no weights to change; write other files from the hook itself");
    });
    return weights;
  }

  /// The writers make and lock the staging directory.
  void open_staging(const std::filesystem::path& target, const std::filesystem::path& partial) {
    on_every_process_or_none(parallel_, "save_state", "preparing " + partial.string(), [&] {
      if (!writer_) return;
      std::filesystem::create_directories(target.parent_path());
      try {
        staging_.emplace(target);
      } catch (const staging_busy& e) {
        if (!settings_.project.save_on_each_node) throw;
        throw staging_busy(std::string(e.what()) +
                           "; with options::project.save_on_each_node each machine's local main process saves into "
                           "the directory on its own disk: on a file system the machines share, leave it off");
      }
    });
  }

  /// This process's part: its own file (or, where it does not see the staging directory, its bytes kept for the
  /// main process to write), its shards in the sharded format; the writers' shared files in the full one.
  void write_parts(const std::filesystem::path& partial, std::string state,
                   const std::vector<safetensors::tensor_list>& weights) {
    const auto name = checkpoint_files::process(parallel_.process_index());
    const bool sees_directory = writer_ || std::filesystem::is_directory(partial);
    if (sees_directory) {
      mine_.push_back(write_atomically<checkpoint_error>(partial / name, [&](auto& out) { out.write(state); }));
    } else {
      mine_.push_back({name, state.size(), crc32c(state)});
      unwritten_ = std::move(state);
    }
    if (layout_.sharded && sees_directory) {
      for (auto& file : write_shards(partial)) mine_.push_back(std::move(file));
    } else if (!layout_.sharded) {
      write_optimizers(partial);  // collectives under the sharded policies
      if (writer_) {
        write_shared_state(partial, weights.size());
        save_models(partial, weights, manifest_, layout_.safe_serialization);
      }
    }
    if (!sees_directory && (layout_.sharded || settings_.project.save_on_each_node))
      throw unseen_directory(partial, parallel_.process_index(), layout_.sharded);
  }

  /// Each optimizer's full state, `optimizer_{i}.bin`, written by the writers. Every process takes part: the
  /// parallel policy may gather the state from every process's shard (`with_full_optimizer_state`). A failure to write
  /// is raised once every process is past those collectives, so that none is left waiting in one.
  void write_optimizers(const std::filesystem::path& dir) {
    const auto optimizers = registry_.optimizers();
    std::exception_ptr failure;
    for (std::size_t i = 0; i < optimizers.size(); ++i)
      parallel_.with_full_optimizer_state(*optimizers[i], [&] {
        if (!writer_ || failure) return;
        try {
          torch::serialize::OutputArchive archive;
          save_optimizer(*optimizers[i], archive);
          manifest_.add(write_archive(archive, dir, checkpoint_files::optimizer(i)));
        } catch (...) {
          failure = std::current_exception();
        }
      });
    if (failure) std::rethrow_exception(failure);
  }

  /// The writers' part: `accel_state.bin` (how many of each object: `models` files or sets of shard files) and the
  /// shared slots.
  void write_shared_state(const std::filesystem::path& dir, std::size_t models) {
    torch::serialize::OutputArchive shared;
    shared.write("processes", c10::IValue(static_cast<std::int64_t>(parallel_.num_processes())));
    shared.write("models", c10::IValue(static_cast<std::int64_t>(models)));
    shared.write("optimizers", c10::IValue(static_cast<std::int64_t>(registry_.optimizers().size())));
    for (const auto& [kind, list] : slots_) {
      shared.write(kind, c10::IValue(static_cast<std::int64_t>(list.size())));
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (list[i]->scope != state_scope::shared) continue;
        torch::serialize::OutputArchive archive;
        list[i]->save(archive);
        manifest_.add(write_archive(archive, dir, checkpoint_files::slot(kind, i)));
      }
    }
    manifest_.add(write_archive(shared, dir, std::string(checkpoint_files::accel_state)));
  }

  /// A sharded checkpoint's part of every process (sharded_format.hpp): its slices of the models and of the
  /// optimizers' state, returned to be gathered into the manifest; the main process also writes the layout table,
  /// each optimizer's groups and options (`optimizer.bin`, without state), `accel_state.bin` and the shared slots.
  std::vector<written_file> write_shards(const std::filesystem::path& dir) {
    const bool main = parallel_.process_index() == 0;
    const int process = parallel_.process_index();
    const auto shard_of = [this](const at::Tensor& tensor) { return parallel_.shard_of(tensor); };
    const auto& models = registry_.models();
    const auto optimizers = registry_.optimizers();
    std::vector<written_file> mine;
    shard_layout_table table{.processes = parallel_.num_processes(), .models = {}};
    for (std::size_t i = 0; i < models.size(); ++i) {
      auto [layout, tensors] = model_shards(*models[i], shard_of, main);
      table.models.push_back(std::move(layout));
      mine.push_back(
          safetensors::save(dir / checkpoint_files::shard(checkpoint_files::kind::model, i, process), tensors));
    }
    for (std::size_t i = 0; i < optimizers.size(); ++i) {
      mine.push_back(safetensors::save(dir / checkpoint_files::shard(checkpoint_files::kind::optimizer, i, process),
                                       optimizer_shards_of(*optimizers[i], models, shard_of, main)));
      if (main)
        without_state(*optimizers[i], [&] {
          torch::serialize::OutputArchive archive;
          save_optimizer(*optimizers[i], archive);
          manifest_.add(write_archive(archive, dir, checkpoint_files::optimizer(i)));
        });
    }
    if (main) {
      write_shared_state(dir, models.size());
      manifest_.add(table.save(dir));
    }
    return mine;
  }

  /// The `random_states_{rank}.bin` files of the processes that do not see the main process's staging directory
  /// (one on a disk their machine does not share), sent to the main process, which writes them: its checkpoint is
  /// whole. One all-reduce when every process sees it.
  void write_unseen_files(const std::filesystem::path& partial) {
    if (!on_any_process(parallel_, !unwritten_.empty())) return;
    auto&& comm = parallel_.communicator();
    const auto files = all_gather_bytes(comm, std::vector<char>(unwritten_.begin(), unwritten_.end()));
    on_every_process_or_none(
        parallel_, "save_state", "writing the files of processes that do not see " + partial.string(), [&] {
          if (!writer_) return;
          for (std::size_t p = 0; p < files.size(); ++p)
            if (!files[p].empty())
              write_atomically<checkpoint_error>(partial / checkpoint_files::process(static_cast<int>(p)),
                                                 [&](auto& out) { out.write(files[p].data(), files[p].size()); });
        });
  }

  /// Every process's own files (`process_file_names`, the same number on each) into the writers' manifest: sizes
  /// and checksums gathered in one all-reduce, each process filling its own rows.
  void gather_process_files() {
    const auto files = static_cast<std::int64_t>(mine_.size());
    auto rows = at::zeros({parallel_.num_processes(), files, 2}, at::kLong);
    for (std::int64_t k = 0; k < files; ++k) {
      rows[parallel_.process_index()][k][0] = static_cast<std::int64_t>(mine_[k].size);
      rows[parallel_.process_index()][k][1] = static_cast<std::int64_t>(mine_[k].crc32c);
    }
    auto&& comm = parallel_.communicator();
    const auto all = reduce(comm, rows, reduction::sum);
    for (int process = 0; process < parallel_.num_processes(); ++process) {
      const auto names = process_file_names(process, registry_, layout_.sharded);
      for (std::int64_t k = 0; k < files; ++k)
        manifest_.add({names[k], static_cast<std::uint64_t>(all[process][k][0].template item<std::int64_t>()),
                       static_cast<std::uint32_t>(all[process][k][1].template item<std::int64_t>())});
    }
  }

  Parallel& parallel_;
  const prepared_registry& registry_;
  const checkpoint_settings& settings_;
  checkpoint_layout layout_;
  slot_map slots_;
  bool writer_;
  std::optional<staging_directory> staging_;
  checkpoint_manifest manifest_;
  std::vector<written_file> mine_;
  std::string unwritten_;  // this process's random states, when it does not see the staging directory
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/writer.ipp"
#endif
