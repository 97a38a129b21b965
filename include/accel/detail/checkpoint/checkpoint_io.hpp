/// \file
/// `checkpoint_io`: what `save_state` and `load_state` do with an accelerator's `training_state`
/// (training_state.hpp): a checkpoint read, checked and applied (reader.hpp), or written atomically (writer.hpp), in
/// accel's formats or Accelerate's (accelerate_format.hpp), synchronously or in the background.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <set>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../comm/flight_recorder.hpp"
#include "../../collectives.hpp"
#include "../../concepts.hpp"
#include "../../options.hpp"
#include "../prepared/registry.hpp"
#include "../support/archive.hpp"
#include "../support/generators.hpp"
#include "../support/write_pacing.hpp"
#include "accelerate_format.hpp"
#include "agreement.hpp"
#include "archives.hpp"
#include "background.hpp"
#include "directory.hpp"
#include "format.hpp"
#include "numbering.hpp"
#include "rank_local.hpp"
#include "reader.hpp"
#include "settings.hpp"
#include "sharded_format.hpp"
#include "snapshot.hpp"
#include "training_state.hpp"
#include "transaction.hpp"
#include "writer.hpp"

namespace accel::detail {

/// Runs `action` inside `around(model, next)` for each of `models[first...]`, nested.
template <class Around, class Action>
void around_each_model(const std::vector<std::shared_ptr<torch::nn::Module>>& models, Around& around, Action& action,
                       std::size_t first = 0) {
  if (first == models.size()) return action();
  around(*models[first], [&] { around_each_model(models, around, action, first + 1); });
}

/// Runs `action` with the parameters of `models` full (a policy that shards parameters gathers them for the while, on
/// every process), keeping what it writes into them.
template <class Parallel, class Action>
void with_full_weights(Parallel& parallel, const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                       Action&& action) {
  auto around = [&parallel](torch::nn::Module& model, const auto& next) { parallel.with_full_parameters(model, next); };
  around_each_model(models, around, action);
}

/// Runs `action` with the parameters of `models` where a rank-local load writes them (rank_local.hpp's
/// `with_weights_to_load`): at rest under a policy that keeps only its slices, so that a load gathers nothing.
template <class Parallel, class Action>
void with_weights_to_load(Parallel& parallel, const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                          Action&& action) {
  auto around = [&parallel](torch::nn::Module& model, const auto& next) {
    with_weights_to_load(parallel, model, next);
  };
  around_each_model(models, around, action);
}

/// The process group of asynchronous saves: the job's processes, apart from the training's collectives (a save's
/// thread and the training loop never wait in one group for each other); made once per process, by every process at
/// its first asynchronous save.
template <class Communicator>
auto& checkpoint_group(Communicator&& job) {  // a single process's communicator is a value
  using separate_type = std::remove_reference_t<decltype(*job.separate(std::string()))>;
  static separate_type* const group = job.separate("accel/checkpoint").release();
  return *group;
}

/// Removes the oldest of `existing` (the numbered checkpoints there were before a save) beyond `total_limit`, counting
/// the new one; each writer its own directory (each machine's, with save_on_each_node). Agreed over `group`.
template <class Group>
void prune_checkpoints(Group& group, const project_options& project,
                       std::map<std::int64_t, std::filesystem::path> existing) {
  on_every_process_or_none(group, "save_state", "removing checkpoints beyond total_limit", [&] {
    if (!writes_shared_files(project, group) || project.total_limit <= 0) return;
    for (; !existing.empty() && static_cast<int>(existing.size()) + 1 > project.total_limit;
         existing.erase(existing.begin()))
      remove_checkpoint_files(existing.begin()->second);  // what accel did not write stays
  });
}

/// Where `load_state` reads the optimizers' state to: `where`, by default (Accelerate's) `on_device` when several
/// processes each have a device of their own (not the CPU), else `cpu`.
ACCEL_DECL c10::Device read_device(std::optional<map_location> where, int processes, const c10::Device& device);

/// Reads and writes the checkpoints of `state`: made for each call (it holds references only).
template <class Parallel, class... Participants>
class checkpoint_io<training_state<Parallel, Participants...>> {
 public:
  explicit checkpoint_io(training_state<Parallel, Participants...>& state)
      : state_(state), parallel_(state.parallel_), registry_(state.registry_), settings_(state.settings_) {}

  /// The number the next `save_next` writes, as this process sees it (numbering.hpp).
  [[nodiscard]] static std::int64_t next_number(const checkpoint_settings& settings) {
    return next_checkpoint_number(settings);
  }
  /// The project's newest checkpoint complete on every process; refused when there is none (a collective).
  [[nodiscard]] std::filesystem::path newest() { return newest_checkpoint(settings_.project, parallel_); }
  /// The same, or none (a collective).
  [[nodiscard]] std::optional<std::filesystem::path> agreed_newest() {
    return agreed_newest_checkpoint(settings_.project, parallel_);
  }

  /// `accelerator::load_model`: the weights in `where` read into `module` as this process holds them (rank_local.hpp).
  template <class Policy>
  static void load_model(Policy& parallel, torch::nn::Module& module, const std::filesystem::path& where) {
    load_held_model(parallel, module, where);
  }

  /// Saves into `directory`, atomically (writer.hpp): in the format the parallel policy asks for, the full one with
  /// the weights full (gathered for the while); or, with `file_set::accelerate`, Accelerate's file set
  /// (accelerate_format.hpp). With `how.asynchronous`, a snapshot now and the files in the background. A save in
  /// flight is waited for first (its failure raised), or, with `in_flight::skip`, this one is skipped. A collective.
  void save(const std::filesystem::path& directory, const save_options& how) {
    if (ready_to_save(how)) save_now(directory, how, std::nullopt);
  }

  /// Saves into the project's next automatic checkpoint (numbering.hpp), then removes the oldest beyond
  /// `total_limit`. Returns the directory written (being written, when asynchronous; empty when skipped).
  std::filesystem::path save_next(const save_options& how) {
    const auto& project = settings_.project;
    if (!project.automatic_checkpoint_naming)
      throw std::invalid_argument(
          "accel::save_state(): without a directory it needs "
          "options::project.automatic_checkpoint_naming; or pass the directory to save to");
    if (!ready_to_save(how)) return {};
    const auto root = checkpoints_root(project);
    auto existing = numbered_checkpoints(root);
    std::int64_t next = 0;
    as_collective("save_state", [&] { next = agree_on_checkpoint_number(settings_, parallel_); });
    const auto directory = root / ("checkpoint_" + std::to_string(next));
    save_now(directory, how, std::move(existing));
    if (settings_.next_number) settings_.next_number = next + 1;
    return directory;
  }

  /// Restores what `save` wrote: the load_state pre-hooks run first; then everything is read and checked
  /// (reader.hpp); then the participants, optimizers and slots load all or none, and the weights and generators,
  /// checked, go last. Every process loads or none does: the processes agree after reading and after loading, so a
  /// problem on any process throws `checkpoint_error` on every process, and every program's state is as it was. The
  /// optimizers' state is read where `how.map_location` says and placed on its parameters' devices. A checkpoint
  /// without a manifest loads only with `how.allow_unchecked`. A collective.
  void load(const std::filesystem::path& directory, const load_options& how) {
    (void)state_.finish_background_save();
    const auto read_to = read_device(how.map_location, parallel_.num_processes(), parallel_.device());
    if (is_accelerate_checkpoint(directory)) {
      load_from_accelerate(directory, read_to);
      count_from_loaded(settings_, directory);  // the project's checkpoint_{k}, whoever wrote it
      return;
    }
    as_collective("load_state", [&] {
      const auto prepared = registry_.models();
      auto models = prepared;             // what the load_state pre-hooks leave
      if (!settings_.load_hooks.empty())  // the hooks see the weights full, as Accelerate's do
        with_full_weights(parallel_, prepared,
                          [&] { models = hooked_models(parallel_, registry_, settings_, directory); });
      with_weights_to_load(parallel_, prepared, [&] {
        std::optional<checkpoint_contents> contents;
        on_every_process_or_none(parallel_, "load_state", "reading " + directory.string(), [&] {
          contents = checkpoint_reader(directory, registry_, parallel_.process_index(), parallel_.num_processes(),
                                       read_to, how.allow_unchecked, parts_held(models))
                         .read(models, !settings_.load_hooks.empty());
        });
        apply(*contents, models, read_to);
      });
    });
    count_from_loaded(settings_, directory);
  }

  /// Restores a checkpoint Accelerate's `save_state` wrote (accelerate_format.hpp): read and checked on every
  /// process first; then the optimizers and schedulers all or none, then the weights and the CPU generator. A
  /// collective.
  void load_from_accelerate(const std::filesystem::path& directory, const c10::Device& read_to) {
    as_collective("load_state", [&] {
      with_full_weights(parallel_, registry_.models(), [&] {
        const auto models = hooked_models(parallel_, registry_, settings_, directory);
        std::optional<accelerate_contents> contents;
        on_every_process_or_none(parallel_, "load_state", "reading " + directory.string(), [&] {
          contents = accelerate_reader(directory, registry_, parallel_.process_index()).read(models);
        });
        apply_from_accelerate(directory, *contents, models, read_to);
      });
    });
  }

 private:
  /// Before a save: the asynchronous save in flight is waited for (its failure raised), unless `how` skips a save
  /// while one is being written, which every process then does; false then.
  bool ready_to_save(const save_options& how) {
    if (how.asynchronous && how.files == ::accel::file_set::accelerate)
      throw checkpoint_error(
          "accel::save_state: an asynchronous save writes accel's file set; file_set::accelerate is written "
          "while the program waits: leave save_options::asynchronous false for it");
    if (how.asynchronous && !(how.write_duty_cycle > 0 && how.write_duty_cycle <= 1))
      throw std::invalid_argument("accel::save_state: save_options::write_duty_cycle is " +
                                  std::to_string(how.write_duty_cycle) +
                                  "; it is the share of its time the save's thread writes: above 0, at most 1");
    if (how.asynchronous && how.if_in_flight == ::accel::in_flight::skip &&
        on_any_process(parallel_, state_.background_.writing())) {
      if (parallel_.process_index() == 0)
        std::cerr << "accel::save_state: skipped: the previous asynchronous save is still being written "
                     "(save_options::if_in_flight = in_flight::skip)\n";
      return false;
    }
    (void)state_.finish_background_save();
    return true;
  }

  /// The save itself, `existing` the numbered checkpoints to prune beyond total_limit once it is complete.
  void save_now(const std::filesystem::path& directory, const save_options& how,
                std::optional<std::map<std::int64_t, std::filesystem::path>> existing) {
    if (how.asynchronous) return save_in_background(directory, how, std::move(existing));
    if (how.files == ::accel::file_set::accelerate) {
      save_for_accelerate(directory, how.safe_serialization);
    } else {
      as_collective("save_state", [&] {
        const auto own_state = [this] { return process_state(); };
        if (parallel_.checkpoint_format() == state_dict_type::sharded)  // nothing gathered
          return checkpoint_writer(parallel_, registry_, settings_, {.sharded = true, .safe_serialization = true})
              .write(directory, own_state);
        with_full_weights(parallel_, registry_.models(), [&] {
          checkpoint_writer(parallel_, registry_, settings_,
                            {.sharded = false, .safe_serialization = how.safe_serialization})
              .write(directory, own_state);
        });
      });
    }
    // Only now that the new checkpoint is complete and synced: a save that fails (a full disk) loses no checkpoint.
    if (existing) prune_checkpoints(parallel_, settings_.project, std::move(*existing));
  }

  /// Takes the snapshot of the training state (the policy's collectives gather what it shards), then writes it in
  /// a thread over the checkpoint group, pruning after it.
  void save_in_background(const std::filesystem::path& directory, const save_options& how,
                          std::optional<std::map<std::int64_t, std::filesystem::path>> existing) {
    (void)checkpoint_directory(directory);  // a directory no save can write is refused here, on every process alike
    as_collective("save_state", [&] {
      auto& comm = checkpoint_group(parallel_.communicator());
      const save_group<std::remove_reference_t<decltype(comm)>> group{
          &comm, parallel_.process_index(), parallel_.num_processes(), parallel_.local_process_index()};
      auto snapshot = std::make_shared<checkpoint_snapshot>(buffers());
      checkpoint_file_names files;
      const auto take = [&](checkpoint_layout layout) {
        checkpoint_writer writer(parallel_, registry_, settings_, layout);
        writer.snapshot(*snapshot, directory, [this] { return process_state(); });
        files = writer.files_of_each_process();
      };
      if (parallel_.checkpoint_format() == state_dict_type::sharded)
        take({.sharded = true, .safe_serialization = true});
      else
        with_full_weights(parallel_, registry_.models(),
                          [&] { take({.sharded = false, .safe_serialization = how.safe_serialization}); });
      state_.background_.start(
          directory, [group, project = settings_.project, files = std::move(files), snapshot, directory,
                      existing = std::move(existing), duty_cycle = how.write_duty_cycle]() mutable {
            const write_pacing pacing(duty_cycle);
            const collective_caller caller("save_state, in the background");  // in the flight record
            snapshot->wait_for_copies();
            write_snapshot(group, project, files, *snapshot, directory);
            if (existing) prune_checkpoints(group, project, std::move(*existing));
          });
    });
  }

  /// This process's own file, serialised: its generators, its participants' state and its per-process slots.
  std::string process_state() {
    torch::serialize::OutputArchive mine;
    for (auto& [key, generator] : generators()) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      mine.write(key, generator.get_state());
    }
    state_.for_each_stateful([&mine](auto& participant) { std::as_const(participant).save_state(mine); });
    for (const auto& [kind, list] : registry_.slots_by_kind())
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (list[i]->scope != state_scope::per_process) continue;
        torch::serialize::OutputArchive slot;
        list[i]->save(slot);
        mine.write(checkpoint_files::slot_key(kind, i), slot);
      }
    return serialised(mine);
  }

  /// What this process holds of `models`' tensors and their optimizer state, which is all a load reads of them
  /// (rank_local.hpp): the slice `shard_of` gives of each parameter the policy shards; of the weights only where the
  /// policy keeps no more than its slices of the parameters (`keeps_parameter_slices`).
  held_parts parts_held(const std::vector<std::shared_ptr<torch::nn::Module>>& models) const {
    held_parts parts;
    for (std::size_t m = 0; m < models.size(); ++m) add_held_parts(parts, parallel_, m, *models[m]);
    return parts;
  }

  /// Sets the generators' states (checked), last in a load: nothing after can fail.
  static void set_generators(std::vector<std::pair<at::Generator, at::Tensor>>& states) {
    for (auto& [generator, state] : states) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state);
    }
  }

  /// The weights of a load whose transaction committed, each model's as this process holds them (those
  /// `sliced_weights` names as its slice): read straight into the parameters where the reader planned their bytes'
  /// ranges, else copied from what it read. Only an I/O error can fail it now, on every process then (the weights
  /// partly loaded, which the error says).
  void install_weights(checkpoint_contents& contents, const std::vector<std::shared_ptr<torch::nn::Module>>& models) {
    on_every_process_or_none(parallel_, "load_state", "reading the weights into the models", [&] {
      for (std::size_t i = 0; i < models.size(); ++i)
        if (contents.ranged && !contents.weight_reads[i].empty())
          read_held_weights(*contents.ranged, *models[i], contents.weight_reads[i], contents.sliced_weights[i]);
        else
          copy_held_weights(*models[i], contents.weights[i], contents.sliced_weights[i]);
    });
  }

  /// The apply step: the participants, optimizers and slots all or none (load_transaction), then the weights and
  /// generators, checked by the reader (each file of weights read whole checked against its checksum before any of
  /// its bytes is read into the weights: nothing to undo).
  void apply(checkpoint_contents& contents, const std::vector<std::shared_ptr<torch::nn::Module>>& models,
             const c10::Device& read_to) {
    load_transaction transaction;  // rolled back unless committed: a failure here, or on another process
    on_every_process_or_none(parallel_, "load_state", "loading the checkpoint's state", [&] {
      state_.for_each_stateful([&](auto& participant) {
        transaction.load(
            contents.process_file, [p = &participant](torch::serialize::OutputArchive& out) { p->save_state(out); },
            [p = &participant](torch::serialize::InputArchive& in) { p->load_state(in); }, contents.process_state);
      });
      load_optimizers(transaction, contents, models, read_to);
      for (const auto& [kind, list] : registry_.slots_by_kind())
        for (std::size_t i = 0; i < list.size(); ++i)
          transaction.load(kind + " " + std::to_string(i) + "'s state in the checkpoint", list[i]->save, list[i]->load,
                           contents.slot_archives[kind][i]);
    });
    transaction.commit();
    install_weights(contents, models);
    set_generators(contents.generator_states);
  }

  /// `load_from_accelerate`'s apply step. Each optimizer's parameters are named by their models' names in errors.
  void apply_from_accelerate(const std::filesystem::path& directory, accelerate_contents& contents,
                             const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                             const c10::Device& read_to) {
    std::map<const void*, std::string> names;
    for (const auto& model : models)
      for (const auto& item : model->named_parameters()) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
    const auto name_of = [&names](const at::Tensor& parameter) {
      const auto found = names.find(parameter.unsafeGetTensorImpl());
      return found == names.end() ? std::string("a parameter of no prepared model") : found->second;
    };
    load_transaction transaction;
    torch::serialize::InputArchive unused;  // the objects load from `contents`; the transaction keeps what they held
    on_every_process_or_none(parallel_, "load_state", "loading the checkpoint's state", [&] {
      const auto optimizers = registry_.optimizers();
      for (std::size_t i = 0; i < optimizers.size(); ++i) {
        auto* optimizer = optimizers[i];
        transaction.load(
            "in the Accelerate checkpoint,", [optimizer](auto& out) { save_optimizer(*optimizer, out); },
            [&, optimizer, i](auto&) {
              parallel_.load_full_optimizer_state(*optimizer, [&] {
                load_python_optimizer(*optimizer, contents.optimizers[i],
                                      (directory / checkpoint_files::optimizer(i)).string(), name_of);
              });
              place_state_on_parameters(*optimizer, read_to);
            },
            unused, [optimizer](auto& in) { load_optimizer(*optimizer, in); });
      }
      const auto slots = registry_.slots_by_kind();
      const auto schedulers = slots.find(std::string(checkpoint_files::kind::scheduler));
      for (std::size_t i = 0; schedulers != slots.end() && i < schedulers->second.size(); ++i) {
        const auto& slot = schedulers->second[i];
        const auto file = (directory / checkpoint_files::slot(checkpoint_files::kind::scheduler, i)).string();
        transaction.load(
            "in the Accelerate checkpoint,", slot->save,
            [&, slot, i, file](auto&) { slot->load_python(contents.schedulers[i], file); }, unused, slot->load);
      }
    });
    transaction.commit();
    for (std::size_t i = 0; i < models.size(); ++i) copy_weights(*models[i], contents.weights[i]);
    set_generators(contents.generator_states);
  }

  /// Writes Accelerate's file set (accelerate_format.hpp) with the weights full: the main process the shared files,
  /// every process its generator states. A collective.
  void save_for_accelerate(const std::filesystem::path& directory, bool safe_serialization) {
    as_collective("save_state", [&] {
      if (parallel_.checkpoint_format() == state_dict_type::sharded)
        throw checkpoint_error(
            "accel::save_state: file_set::accelerate (Accelerate's files) writes full state dicts; this "
            "parallel policy saves the sharded format (save that, then accel merge-weights)");
      with_full_weights(parallel_, registry_.models(), [&] {
        on_every_process_or_none(parallel_, "save_state", "writing " + directory.string(), [&] {
          write_accelerate_checkpoint(directory, registry_, registry_.models(), parallel_.process_index(),
                                      safe_serialization);
        });
      });
    });
  }

  /// Each optimizer loads a full state, which the parallel policy may shard; what is kept to undo is the
  /// optimizer's own state, put back as it is. A sharded checkpoint's state, read as this process holds it, is set
  /// on what the optimizer lists once the policy has it (its shards), by its parameter's name.
  void load_optimizers(load_transaction& transaction, checkpoint_contents& contents,
                       const std::vector<std::shared_ptr<torch::nn::Module>>& models, const c10::Device& read_to) {
    std::map<const void*, std::string> state_names;
    for (std::size_t m = 0; contents.sharded && m < models.size(); ++m)
      for (const auto& item : models[m]->named_parameters()) {
        state_names.emplace(item.value().unsafeGetTensorImpl(), state_field_name(m, item.key(), ""));
        if (const auto shard = parallel_.shard_of(item.value()))
          state_names.emplace(shard->slice.unsafeGetTensorImpl(), state_field_name(m, item.key(), ""));
      }
    const auto state_name = [&state_names](const at::Tensor& parameter) {
      const auto found = state_names.find(parameter.unsafeGetTensorImpl());
      return found == state_names.end() ? std::string() : found->second;
    };
    const auto optimizers = registry_.optimizers();
    for (std::size_t i = 0; i < optimizers.size(); ++i) {
      auto* optimizer = optimizers[i];
      transaction.load(
          checkpoint_files::optimizer(i),
          [optimizer](torch::serialize::OutputArchive& out) { save_optimizer(*optimizer, out); },
          [&, optimizer, i](torch::serialize::InputArchive& in) {
            parallel_.load_full_optimizer_state(*optimizer, [&] { load_optimizer(*optimizer, in); });
            if (contents.sharded) set_full_state(*optimizer, contents.optimizer_states[i], state_name);
            place_state_on_parameters(*optimizer, read_to);
          },
          contents.optimizer_archives[i],
          [optimizer](torch::serialize::InputArchive& in) { load_optimizer(*optimizer, in); });
    }
  }

  /// The buffers of asynchronous saves' snapshots, made at the first and kept for the next.
  snapshot_buffers& buffers() {
    if (!state_.buffers_) state_.buffers_ = std::make_shared<snapshot_buffers>();
    return *state_.buffers_;
  }

  training_state<Parallel, Participants...>& state_;
  Parallel& parallel_;
  prepared_registry& registry_;
  checkpoint_settings& settings_;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/checkpoint_io.ipp"
#endif
