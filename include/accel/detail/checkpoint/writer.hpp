/// \file
/// One save of a checkpoint into its directory, atomically, in two halves. `checkpoint_writer` produces the parts of
/// the checkpoint from the live objects, through the parallel policy (which gathers what it shards), into a sink:
/// `checkpoint_file_writer`, which writes each part into the locked staging directory `DIR.partial` (directory.hpp)
/// at once, or a `checkpoint_snapshot` (snapshot.hpp), which copies it for a background thread to hand to a
/// `checkpoint_file_writer` later (`write_snapshot`). The file writer then adds the manifest of sizes and checksums,
/// and the staging directory replaces the old checkpoint, keeping what accel did not write. Each step is agreed on
/// by every process (agreement.hpp) over a process group (the policy's, or a background save's own), so that a
/// failure anywhere fails the save everywhere and leaves the previous checkpoint as it was. What each process holds
/// of its own (its generators, its policies' state) reaches the writer as bytes: the writer knows the files, not the
/// participants (training_state.hpp; checkpoint_io.hpp drives it).
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
#include "agreement.hpp"
#include "archives.hpp"
#include "directory.hpp"
#include "format.hpp"
#include "manifest.hpp"
#include "settings.hpp"
#include "sharded_format.hpp"
#include "snapshot.hpp"

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

/// The names of each process's own files in one checkpoint (`process_file_names`; the manifest lists them), and its
/// format.
struct checkpoint_file_names {
  std::vector<std::vector<std::string>> names;
  bool sharded = false;
};

/// What a process that does not see the staging directory its writer made is told, where it must see it.
ACCEL_DECL checkpoint_error unseen_directory(const std::filesystem::path& partial, int process, bool sharded);

/// The files of one save in the staging directory, written over `Group`'s processes (the parallel policy, or a
/// background save's own process group: process_index(), num_processes(), local_process_index(), communicator()):
/// `open` makes and locks the directory; the parts arrive as checkpoint_writer produces them (this is one of its
/// sinks); `close` writes the files of processes that do not see the directory, the manifest, and installs the
/// checkpoint. A save that does not reach the end of `close` leaves the previous checkpoint as it was.
template <class Group>
class checkpoint_file_writer {
 public:
  checkpoint_file_writer(Group& group, const project_options& project, checkpoint_file_names files)
      : group_(group), project_(project), files_(std::move(files)), writer_(writes_shared_files(project, group)) {}
  checkpoint_file_writer(const checkpoint_file_writer&) = delete;
  checkpoint_file_writer& operator=(const checkpoint_file_writer&) = delete;
  ~checkpoint_file_writer() {
    if (staging_ && !installed_) staging_->discard();
  }

  /// The writers make and lock the staging directory of `directory`'s checkpoint.
  void open(const std::filesystem::path& directory) {
    target_ = checkpoint_directory(directory);
    partial_ = std::filesystem::path(target_.string() + ".partial");
    on_every_process_or_none(group_, "save_state", "preparing " + partial_.string(), [&] {
      if (!writer_) return;
      std::filesystem::create_directories(target_.parent_path());
      try {
        staging_.emplace(target_);
      } catch (const staging_busy& e) {
        if (!project_.save_on_each_node) throw;
        throw staging_busy(std::string(e.what()) +
                           "; with options::project.save_on_each_node each machine's local main process saves into "
                           "the directory on its own disk: on a file system the machines share, leave it off");
      }
    });
    sees_directory_ = writer_ || std::filesystem::is_directory(partial_);
  }

  /// This process's own file (where it does not see the staging directory, its bytes kept for the main process).
  void own_file(const std::string& name, std::string bytes) {
    if (sees_directory_) {
      mine_.push_back(write_atomically<checkpoint_error>(partial_ / name, [&](auto& out) { out.write(bytes); }));
    } else {
      mine_.push_back({name, bytes.size(), crc32c(bytes)});
      unwritten_ = std::move(bytes);
    }
  }
  /// This process's shard file.
  void own_tensors(const std::string& name, const safetensors::tensor_list& tensors) {
    if (!sees_directory_) throw unseen_directory(partial_, group_.process_index(), true);
    mine_.push_back(safetensors::save(partial_ / name, tensors));
  }
  void shared_archive(const std::string& name, torch::serialize::OutputArchive& archive) {
    manifest_.add(write_archive(archive, partial_, name));
  }
  void shared_bytes(const std::string& name, const std::string& bytes) {
    manifest_.add(write_atomically<checkpoint_error>(partial_ / name, [&](auto& out) { out.write(bytes); }));
  }
  void optimizer_archive(const std::string& name, torch::optim::Optimizer& optimizer) {
    torch::serialize::OutputArchive archive;
    save_optimizer(optimizer, archive);
    shared_archive(name, archive);
  }
  void models(const std::vector<safetensors::tensor_list>& weights, bool safe_serialization) {
    save_models(partial_, weights, manifest_, safe_serialization);
  }
  void layout_table(const shard_layout_table& table) { manifest_.add(table.save(partial_)); }

  /// Every part given: a process that must see the staging directory and does not is refused.
  void check_seen() const {
    if (!sees_directory_ && (files_.sharded || project_.save_on_each_node))
      throw unseen_directory(partial_, group_.process_index(), files_.sharded);
  }

  /// The files of the processes that do not see the directory, the manifest, and the checkpoint put in place.
  void close() {
    write_unseen_files();
    gather_process_files();
    on_every_process_or_none(group_, "save_state", "putting " + target_.string() + " in place", [&] {
      if (!writer_) return;
      write_atomically<checkpoint_error>(partial_ / checkpoint_files::manifest,
                                         [&](auto& out) { out.write(manifest_.text()); });
      staging_->install();
    });
    installed_ = true;
  }

 private:
  /// The `random_states_{rank}.bin` files of the processes that do not see the main process's staging directory
  /// (one on a disk their machine does not share), sent to the main process, which writes them: its checkpoint is
  /// whole. One all-reduce when every process sees it.
  void write_unseen_files() {
    if (!on_any_process(group_, !unwritten_.empty())) return;
    auto&& comm = group_.communicator();
    const auto files = all_gather_bytes(comm, std::vector<char>(unwritten_.begin(), unwritten_.end()));
    on_every_process_or_none(
        group_, "save_state", "writing the files of processes that do not see " + partial_.string(), [&] {
          if (!writer_) return;
          for (std::size_t p = 0; p < files.size(); ++p)
            if (!files[p].empty())
              write_atomically<checkpoint_error>(partial_ / checkpoint_files::process(static_cast<int>(p)),
                                                 [&](auto& out) { out.write(files[p].data(), files[p].size()); });
        });
  }

  /// Every process's own files (the same number on each) into the writers' manifest: sizes and checksums gathered
  /// in one all-reduce, each process filling its own rows.
  void gather_process_files() {
    const auto files = static_cast<std::int64_t>(mine_.size());
    auto rows = at::zeros({group_.num_processes(), files, 2}, at::kLong);
    for (std::int64_t k = 0; k < files; ++k) {
      rows[group_.process_index()][k][0] = static_cast<std::int64_t>(mine_[k].size);
      rows[group_.process_index()][k][1] = static_cast<std::int64_t>(mine_[k].crc32c);
    }
    auto&& comm = group_.communicator();
    const auto all = reduce(comm, rows, reduction::sum);
    for (int process = 0; process < group_.num_processes(); ++process)
      for (std::int64_t k = 0; k < files; ++k)
        manifest_.add({files_.names[process][k],
                       static_cast<std::uint64_t>(all[process][k][0].template item<std::int64_t>()),
                       static_cast<std::uint32_t>(all[process][k][1].template item<std::int64_t>())});
  }

  Group& group_;
  const project_options& project_;
  checkpoint_file_names files_;
  bool writer_;
  std::filesystem::path target_, partial_;
  std::optional<staging_directory> staging_;
  bool sees_directory_ = false, installed_ = false;
  checkpoint_manifest manifest_;
  std::vector<written_file> mine_;
  std::string unwritten_;  // this process's random states, when it does not see the staging directory
};

/// The processes of a background save: the job's, over a process group of their own, so that the save's collectives
/// never meet the training's (what agreement.hpp and checkpoint_file_writer ask of a group).
template <class Communicator>
struct save_group {
  Communicator* comm;
  int index, count, local_index;

  [[nodiscard]] Communicator& communicator() const noexcept { return *comm; }
  [[nodiscard]] int process_index() const noexcept { return index; }
  [[nodiscard]] int num_processes() const noexcept { return count; }
  [[nodiscard]] int local_process_index() const noexcept { return local_index; }
};

/// A snapshot's checkpoint, written into `directory` over `group` (in a background save's thread): the second half
/// of `checkpoint_writer::snapshot`.
template <class Group>
void write_snapshot(Group& group, const project_options& project, const checkpoint_file_names& files,
                    checkpoint_snapshot& snapshot, const std::filesystem::path& directory) {
  checkpoint_file_writer<Group> writer(group, project, files);
  writer.open(directory);
  on_every_process_or_none(group, "save_state", "writing its part of the checkpoint", [&] {
    snapshot.write_into(writer);
    writer.check_seen();
  });
  writer.close();
}

/// The parts of one checkpoint of the prepared objects of `registry`, produced by every process (a collective: the
/// parallel policy gathers what it shards) into a sink: the files now (`write`), or a snapshot (`snapshot`).
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
    const auto weights = hooked_weights(directory);
    checkpoint_file_writer<Parallel> files(parallel_, settings_.project, files_of_each_process());
    files.open(directory);
    on_every_process_or_none(parallel_, "save_state", "writing its part of the checkpoint", [&] {
      produce(files, own_state(), weights);
      files.check_seen();
    });
    files.close();
  }

  /// Copies the checkpoint's parts into `snapshot`, for `write_snapshot` to write into `directory` later.
  template <class OwnState>
  void snapshot(checkpoint_snapshot& snapshot, const std::filesystem::path& directory, OwnState&& own_state) {
    check_request();
    const auto weights = hooked_weights(directory);
    on_every_process_or_none(parallel_, "save_state", "copying its part of the checkpoint", [&] {
      produce(snapshot, own_state(), weights);
      snapshot.finish();
    });
  }

  /// The names of each process's own files, which the manifest lists.
  [[nodiscard]] checkpoint_file_names files_of_each_process() const {
    checkpoint_file_names files{.names = {}, .sharded = layout_.sharded};
    for (int process = 0; process < parallel_.num_processes(); ++process)
      files.names.push_back(process_file_names(process, registry_, layout_.sharded));
    return files;
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

  /// This process's parts: its own file, its shards in the sharded format; the writers' shared files in the full
  /// one.
  template <class Sink>
  void produce(Sink& sink, std::string state, const std::vector<safetensors::tensor_list>& weights) {
    sink.own_file(checkpoint_files::process(parallel_.process_index()), std::move(state));
    if (layout_.sharded) return produce_shards(sink);
    produce_optimizers(sink);  // collectives under the sharded policies
    if (!writer_) return;
    produce_shared_state(sink, weights.size());
    sink.models(weights, layout_.safe_serialization);
  }

  /// Each optimizer's full state, `optimizer_{i}.bin`, from the writers. Every process takes part: the parallel
  /// policy may gather the state from every process's shard (`with_full_optimizer_state`). A failure is raised once
  /// every process is past those collectives, so that none is left waiting in one.
  template <class Sink>
  void produce_optimizers(Sink& sink) {
    const auto optimizers = registry_.optimizers();
    std::exception_ptr failure;
    for (std::size_t i = 0; i < optimizers.size(); ++i)
      parallel_.with_full_optimizer_state(*optimizers[i], [&] {
        if (!writer_ || failure) return;
        try {
          sink.optimizer_archive(checkpoint_files::optimizer(i), *optimizers[i]);
        } catch (...) {
          failure = std::current_exception();
        }
      });
    if (failure) std::rethrow_exception(failure);
  }

  /// The writers' part: `accel_state.bin` (how many of each object: `models` files or sets of shard files) and the
  /// shared slots.
  template <class Sink>
  void produce_shared_state(Sink& sink, std::size_t models) {
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
        sink.shared_archive(checkpoint_files::slot(kind, i), archive);
      }
    }
    sink.shared_archive(std::string(checkpoint_files::accel_state), shared);
  }

  /// A sharded checkpoint's part of every process (sharded_format.hpp): its slices of the models and of the
  /// optimizers' state; the main process also gives the layout table, each optimizer's groups and options
  /// (`optimizer.bin`, without state), `accel_state.bin` and the shared slots.
  template <class Sink>
  void produce_shards(Sink& sink) {
    const bool main = parallel_.process_index() == 0;
    const int process = parallel_.process_index();
    const auto shard_of = [this](const at::Tensor& tensor) { return parallel_.shard_of(tensor); };
    const auto& models = registry_.models();
    const auto optimizers = registry_.optimizers();
    shard_layout_table table{.processes = parallel_.num_processes(), .models = {}};
    for (std::size_t i = 0; i < models.size(); ++i) {
      auto [layout, tensors] = model_shards(*models[i], shard_of, main);
      table.models.push_back(std::move(layout));
      sink.own_tensors(checkpoint_files::shard(checkpoint_files::kind::model, i, process), tensors);
    }
    for (std::size_t i = 0; i < optimizers.size(); ++i) {
      sink.own_tensors(checkpoint_files::shard(checkpoint_files::kind::optimizer, i, process),
                       optimizer_shards_of(*optimizers[i], models, shard_of, main));
      if (main)
        without_state(*optimizers[i], [&] {
          torch::serialize::OutputArchive archive;
          save_optimizer(*optimizers[i], archive);
          sink.shared_archive(checkpoint_files::optimizer(i), archive);
        });
    }
    if (!main) return;
    produce_shared_state(sink, models.size());
    sink.layout_table(table);
  }

  Parallel& parallel_;
  const prepared_registry& registry_;
  const checkpoint_settings& settings_;
  checkpoint_layout layout_;
  slot_map slots_;
  bool writer_;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/writer.ipp"
#endif
