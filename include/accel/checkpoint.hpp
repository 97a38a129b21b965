/// \file
/// Saving and loading a whole training state: what `accelerator::save_state` and `load_state` forward to. Free
/// functions over the registry of prepared objects (detail/registry.hpp) and the policies: models, optimizers and
/// shared slots from the main process, and from every process its generators, its policies' own state (the
/// `save_state(archive) const` / `load_state(archive)` hooks) and its per-process slots. The files are described
/// in docs/checkpoint-format.md.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "checkpoint_error.hpp"
#include "collectives.hpp"
#include "concepts.hpp"
#include "detail/atomic_file.hpp"
#include "detail/checkpoint_directory.hpp"
#include "detail/checkpoint_manifest.hpp"
#include "detail/checkpoint_slot.hpp"
#include "detail/optimizer_state.hpp"
#include "detail/registry.hpp"
#include "detail/scope.hpp"
#include "detail/shard_files.hpp"
#include "detail/generators.hpp"
#include "model_weights.hpp"
#include "options.hpp"
#include "removable_handle.hpp"
#include "safetensors.hpp"

namespace accel {

/// Where `load_state` reads the optimizers' state to (Accelerate's `map_location`): into CPU memory (`cpu`), or
/// straight onto the accelerator's `device()` (`on_device`). Either way each state tensor ends on its parameter's
/// device, where PyTorch's `load_state_dict` puts it (LibTorch's `Optimizer::load` leaves it where it was read to).
enum class map_location { cpu, on_device };

/// `register_save_state_pre_hook`'s hook (Accelerate's): called on every process, before anything is written, with
/// the prepared models, their weights (each one's parameters and buffers by name, what `model.safetensors` holds;
/// empty in the sharded format) and the checkpoint's directory. The weights are the hook's to change: the i-th
/// entry left is written as `model_{i}.safetensors`, so a hook that saves a model its own way removes its entry, and
/// a load hook then removes that model.
using save_state_pre_hook =
    std::function<void(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                       std::vector<safetensors::tensor_list>& weights, const std::filesystem::path& directory)>;
/// `register_load_state_pre_hook`'s hook: called on every process, before anything is read, with the prepared models
/// (none when the checkpoint is in the sharded format) and the directory. The models are the hook's to change: the
/// i-th left loads `model_{i}.safetensors`.
using load_state_pre_hook = std::function<void(std::vector<std::shared_ptr<torch::nn::Module>>& models,
                                               const std::filesystem::path& directory)>;

}  // namespace accel

namespace accel::detail {

/// `model.safetensors`, `model_1.safetensors`, ... as Accelerate names them.
inline std::string numbered(const std::string& stem, std::size_t i, const std::string& extension) {
  std::string name = stem;  // appended in place: GCC 12 warns falsely (-Wstringop-overflow) on stem + (...)
  if (i > 0) name.append("_").append(std::to_string(i));
  return name.append(extension);
}
inline std::string process_file(int process_index) { return "random_states_" + std::to_string(process_index) + ".bin"; }

/// What an accelerator keeps for its checkpoints besides the prepared objects and the policies: its project options,
/// its pre-hooks, and the number of its next automatic checkpoint once that is fixed (Accelerate's `save_iteration`:
/// `project.iteration`, then the number after each automatic save or after the `checkpoint_{k}` loaded).
struct checkpoint_settings {
  explicit checkpoint_settings(const project_options& options) : project(options), next_number(options.iteration) {
    if (next_number) check_checkpoint_number(*next_number, "accel::options: project.iteration");
  }
  /// Refuses a number no checkpoint can have; `what` names where it came from.
  static void check_checkpoint_number(std::int64_t number, const std::string& what) {
    if (number < 0 || number == std::numeric_limits<std::int64_t>::max())
      throw std::invalid_argument(what + " = " + std::to_string(number) +
                                  " is not a checkpoint number: give 0 or more (below the largest int64)");
  }

  project_options project;
  hook_list<save_state_pre_hook> save_hooks;
  hook_list<load_state_pre_hook> load_hooks;
  std::optional<std::int64_t> next_number;
};

/// Whether this process writes the checkpoint's shared files: the main process, or with `save_on_each_node` each
/// machine's local main process.
template <class Parallel>
bool writes_shared_files(const project_options& project, const Parallel& parallel) {
  return (project.save_on_each_node ? parallel.local_process_index() : parallel.process_index()) == 0;
}

/// The LibTorch archive `directory/name`, its bytes checked against the manifest before LibTorch parses them; its
/// tensors are read onto `device` when one is given, else onto the devices they were saved from.
inline torch::serialize::InputArchive read_archive(const std::filesystem::path& directory, const std::string& name,
                                                   const std::optional<checkpoint_manifest>& manifest,
                                                   const std::optional<c10::Device>& device = std::nullopt) {
  const auto bytes = read_checkpoint_file(directory, name, manifest);
  torch::serialize::InputArchive archive;
  try {
    if (device)
      archive.load_from(bytes.data(), bytes.size(), *device);
    else
      archive.load_from(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    throw checkpoint_error("accel::load_state: " + (directory / name).string() +
                           " is truncated or corrupt: " + first_line(e.what()));
  }
  return archive;
}

/// Writes `archive` to `directory/name`: serialised in memory first, then written by accel, so that a full disk
/// is a `checkpoint_error` (LibTorch's own file writer aborts the process then).
inline written_file write_archive(torch::serialize::OutputArchive& archive, const std::filesystem::path& directory,
                                  const std::string& name) {
  const auto bytes = serialised(archive);
  return write_atomically<checkpoint_error>(directory / name, [&](auto& out) { out.write(bytes); });
}

/// Runs `step` here, then agrees with every process on whether it succeeded everywhere (one all-reduce, which is
/// also the barrier between save_state's steps): a failure on any process is raised on all of them, there with
/// its own error, elsewhere naming the step, so that no process is left waiting for one that gave up. `call` is
/// the accelerator's call in messages (`save_state`, `load_state`).
template <class Parallel, class Step>
void on_every_process_or_none(Parallel& parallel, std::string_view call, const std::string& step_name, Step&& step) {
  std::exception_ptr failure;
  try {
    std::forward<Step>(step)();
  } catch (const std::filesystem::filesystem_error& e) {  // the checkpoint's I/O errors are checkpoint_error
    failure = std::make_exception_ptr(checkpoint_error("accel::" + std::string(call) + ": " + e.what()));
  } catch (...) {
    failure = std::current_exception();
  }
  const bool failed_somewhere = on_any_process(parallel, failure != nullptr);
  if (failure) std::rethrow_exception(failure);
  if (failed_somewhere)
    throw checkpoint_error("accel::" + std::string(call) + ": another process failed while " + step_name +
                           " (its own error says why)");
}

using slot_map = std::map<std::string, std::vector<std::shared_ptr<checkpoint_slot>>>;

/// An optimizer's archive: LibTorch's, plus its groups' learning rates, which LibTorch's `load` does not restore
/// (a scheduler's work).
inline void save_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::OutputArchive& archive) {
  optimizer.save(archive);
  std::vector<double> lrs;
  for (auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  archive.write("accel_learning_rates", c10::IValue(lrs));
}
inline void load_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive) {
  optimizer.load(archive);
  c10::IValue lrs;
  if (!archive.try_read("accel_learning_rates", lrs)) return;
  const auto values = lrs.toDoubleVector();
  auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size() && g < values.size(); ++g) groups[g].options().set_lr(values[g]);
}

/// Moves each state tensor of `optimizer` onto its parameter's device, where PyTorch's `load_state_dict` puts it and
/// LibTorch's `Optimizer::load` does not: it leaves them where the archive was read to, `read_to`. The elementwise
/// optimizers' fields move one by one; another optimizer's state (LBFGS's) is read again from its own archive onto
/// the parameter's device, when that is not `read_to`.
inline void place_state_on_parameters(torch::optim::Optimizer& optimizer, const c10::Device& read_to) {
  auto& states = optimizer.state();
  for (auto& group : optimizer.param_groups())
    for (auto& parameter : group.params()) {
      const auto found = states.find(compat::optimizer_state_key(parameter));
      if (found == states.end()) continue;
      const auto device = parameter.device();
      const bool elementwise = transform_state_tensors(*found->second, [&device](const at::Tensor& tensor) {
        return tensor.device() == device ? tensor : tensor.to(device);
      });
      if (elementwise || device == read_to) continue;
      torch::serialize::OutputArchive out;
      found->second->serialize(out);
      const auto bytes = serialised(out);
      torch::serialize::InputArchive in;
      in.load_from(bytes.data(), bytes.size(), device);
      found->second->serialize(in);
    }
}

/// Each optimizer's whole state, `optimizer_{i}.bin`, written by the `writer` processes. Every process takes part:
/// the parallel policy may gather the state from every process's shard (`with_whole_optimizer`). A failure to write
/// is raised once every process is past those collectives, so that none is left waiting in one.
template <class Parallel>
void save_optimizers(const std::filesystem::path& dir, Parallel& parallel, const prepared_registry& registry,
                     checkpoint_manifest& manifest, bool writer) {
  const auto optimizers = registry.optimizers();
  std::exception_ptr failure;
  for (std::size_t i = 0; i < optimizers.size(); ++i)
    parallel.with_whole_optimizer(*optimizers[i], [&] {
      if (!writer || failure) return;
      try {
        torch::serialize::OutputArchive archive;
        save_optimizer(*optimizers[i], archive);
        manifest.add(write_archive(archive, dir, numbered("optimizer", i, ".bin")));
      } catch (...) {
        failure = std::current_exception();
      }
    });
  if (failure) std::rethrow_exception(failure);
}

/// The writers' part: `accel_state.bin` (how many of each object: `models` files or sets of shard files) and the
/// shared slots.
inline void save_shared_state(const std::filesystem::path& dir, int num_processes, std::size_t models,
                              const prepared_registry& registry, const slot_map& slots, checkpoint_manifest& manifest) {
  torch::serialize::OutputArchive shared;
  shared.write("processes", c10::IValue(static_cast<std::int64_t>(num_processes)));
  shared.write("models", c10::IValue(static_cast<std::int64_t>(models)));
  const auto optimizers = registry.optimizers();
  shared.write("optimizers", c10::IValue(static_cast<std::int64_t>(optimizers.size())));
  for (const auto& [kind, list] : slots) {
    shared.write(kind, c10::IValue(static_cast<std::int64_t>(list.size())));
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (list[i]->scope != state_scope::shared) continue;
      torch::serialize::OutputArchive archive;
      list[i]->save(archive);
      manifest.add(write_archive(archive, dir, numbered(kind, i, ".bin")));
    }
  }
  manifest.add(write_archive(shared, dir, "accel_state.bin"));
}

/// The full format's i-th model file: `model_{i}.safetensors`, or with `safe_serialization` off Accelerate's
/// `pytorch_model_{i}.bin` (a pickled dict of tensors).
inline std::string model_file(std::size_t i, bool safe_serialization) {
  return safe_serialization ? numbered("model", i, ".safetensors") : numbered("pytorch_model", i, ".bin");
}

/// The full format's model files: the i-th entry of `weights` (what the save_state pre-hooks left) as
/// `model_file(i, safe_serialization)`.
inline void save_models(const std::filesystem::path& dir, const std::vector<safetensors::tensor_list>& weights,
                        checkpoint_manifest& manifest, bool safe_serialization) {
  for (std::size_t i = 0; i < weights.size(); ++i)
    manifest.add(save_tensors(weights[i], dir / model_file(i, safe_serialization), safe_serialization));
}

/// The i-th model's weights in a full checkpoint, from the file its save wrote (safetensors unless only the
/// pickled file is there), checked against the manifest; and that file's name.
inline std::pair<safetensors::tensor_list, std::string> read_model_weights(
    const std::filesystem::path& dir, std::size_t i, const std::optional<checkpoint_manifest>& manifest) {
  const bool pickled =
      !std::filesystem::exists(dir / model_file(i, true)) && std::filesystem::exists(dir / model_file(i, false));
  const auto name = model_file(i, !pickled);
  const auto bytes = read_checkpoint_file(dir, name, manifest);
  const auto path = (dir / name).string();
  return {pickled ? unpickle_tensors(bytes, path) : safetensors::parse(bytes, path), name};
}

/// The files each process writes of its own, in order: its `random_states_{rank}.bin`, then in a sharded checkpoint
/// its shard of each model and of each optimizer.
inline std::vector<std::string> process_file_names(int process, const prepared_registry& registry, bool sharded) {
  std::vector<std::string> names{process_file(process)};
  if (!sharded) return names;
  for (std::size_t i = 0; i < registry.models().size(); ++i) names.push_back(shard_file("model", i, process));
  for (std::size_t i = 0; i < registry.optimizers().size(); ++i) names.push_back(shard_file("optimizer", i, process));
  return names;
}

/// A sharded checkpoint's part of every process (shard_files.hpp): its slices of the models and of the optimizers'
/// state, returned to be gathered into the manifest; the main process also writes the layout table, each
/// optimizer's groups and options (`optimizer.bin`, without state), `accel_state.bin` and the shared slots.
template <class Parallel>
std::vector<written_file> save_shards(const std::filesystem::path& dir, Parallel& parallel,
                                      const prepared_registry& registry, const slot_map& slots,
                                      checkpoint_manifest& manifest) {
  const bool main = parallel.process_index() == 0;
  const int process = parallel.process_index();
  const auto shard_of = [&parallel](const at::Tensor& tensor) { return parallel.shard_of(tensor); };
  const auto& models = registry.models();
  const auto optimizers = registry.optimizers();
  std::vector<written_file> mine;
  shard_layout_table table{.processes = parallel.num_processes(), .models = {}};
  for (std::size_t i = 0; i < models.size(); ++i) {
    auto [layout, tensors] = model_shards(*models[i], shard_of, main);
    table.models.push_back(std::move(layout));
    mine.push_back(safetensors::save(dir / shard_file("model", i, process), tensors));
  }
  for (std::size_t i = 0; i < optimizers.size(); ++i) {
    mine.push_back(safetensors::save(dir / shard_file("optimizer", i, process),
                                     optimizer_shards_of(*optimizers[i], models, shard_of, main)));
    if (main)
      without_state(*optimizers[i], [&] {
        torch::serialize::OutputArchive archive;
        save_optimizer(*optimizers[i], archive);
        manifest.add(write_archive(archive, dir, numbered("optimizer", i, ".bin")));
      });
  }
  if (main) {
    save_shared_state(dir, parallel.num_processes(), models.size(), registry, slots, manifest);
    manifest.add(table.save(dir));
  }
  return mine;
}

/// Every process's part, serialised: its generators, its policies' state and its per-process slots (`{kind}_{i}`).
template <class... Policies>
std::string process_state(const slot_map& slots, const Policies&... policies) {
  torch::serialize::OutputArchive mine;
  for (auto& [key, generator] : generators()) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    mine.write(key, generator.get_state());
  }
  const auto save_policy = [&mine](const auto& policy) {
    if constexpr (stateful_policy<std::remove_cvref_t<decltype(policy)>>) policy.save_state(mine);
  };
  (save_policy(policies), ...);
  for (const auto& [kind, list] : slots)
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (list[i]->scope != state_scope::per_process) continue;
      torch::serialize::OutputArchive slot;
      list[i]->save(slot);
      mine.write(kind + "_" + std::to_string(i), slot);
    }
  return serialised(mine);
}

/// Every process's own files (`process_file_names`, the same number on each) into the main process's manifest:
/// sizes and checksums gathered in one all-reduce, each process filling its own rows.
template <class Parallel>
void gather_process_files(Parallel& parallel, const std::vector<written_file>& mine,
                          const std::vector<std::vector<std::string>>& names, checkpoint_manifest& manifest) {
  const auto files = static_cast<std::int64_t>(mine.size());
  auto rows = at::zeros({parallel.num_processes(), files, 2}, at::kLong);
  for (std::int64_t k = 0; k < files; ++k) {
    rows[parallel.process_index()][k][0] = static_cast<std::int64_t>(mine[k].size);
    rows[parallel.process_index()][k][1] = static_cast<std::int64_t>(mine[k].crc32c);
  }
  auto&& comm = parallel.communicator();
  const auto all = reduce(comm, rows, reduction::sum);
  for (int process = 0; process < parallel.num_processes(); ++process)
    for (std::int64_t k = 0; k < files; ++k)
      manifest.add({names[process][k], static_cast<std::uint64_t>(all[process][k][0].template item<std::int64_t>()),
                    static_cast<std::uint32_t>(all[process][k][1].template item<std::int64_t>())});
}

/// Gives every process process `source`'s copy of what a checkpoint saves once for the job (each optimizer's state
/// with its learning rates, the shared slots: schedulers and registered objects) and of the policies' state, sent
/// instead of written: after join_uneven_inputs, the processes that stopped early take the training state of the
/// last to stop, so that every process goes on from the same state. A collective.
template <class Parallel, class... Policies>
void share_training_state(Parallel& parallel, const prepared_registry& registry, int source, Policies&... policies) {
  auto&& comm = parallel.communicator();
  // Read to the CPU: the sender's tensors name its device, which is another process's GPU under NCCL.
  const auto share = [&](const auto& save, const auto& load) {
    std::vector<char> bytes;
    if (comm.rank() == source) {
      torch::serialize::OutputArchive archive;
      save(archive);
      const auto text = serialised(archive);
      bytes.assign(text.begin(), text.end());
    }
    bytes = broadcast_bytes(comm, bytes, source);
    if (comm.rank() == source) return;
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size(), c10::Device(c10::kCPU));
    load(archive);
  };
  for (auto* optimizer : registry.optimizers())
    share([optimizer](auto& out) { save_optimizer(*optimizer, out); },
          [optimizer](auto& in) {
            load_optimizer(*optimizer, in);
            place_state_on_parameters(*optimizer, c10::Device(c10::kCPU));
          });
  for (const auto& [kind, list] : registry.slots_by_kind())
    for (const auto& slot : list)
      if (slot->scope == state_scope::shared && slot->save) share(slot->save, slot->load);
  const auto share_policy = [&](auto& policy) {
    if constexpr (stateful_policy<std::remove_cvref_t<decltype(policy)>>)
      share([&policy](auto& out) { policy.save_state(out); }, [&policy](auto& in) { policy.load_state(in); });
  };
  (share_policy(policies), ...);
}

/// Runs `action`, a collective of the accelerator's `call`: a collective that fails in it (a timeout, a process
/// gone) says that every process must make that call, the usual cause of a save that never completes.
template <class Action>
void as_collective(const char* call, Action&& action) {
  try {
    std::forward<Action>(action)();
  } catch (const collective_error& e) {
    throw collective_error(std::string(e.what()) + "; accel::" + call +
                           " is a collective: every process must call it (a call under `if (acc.is_main_process())` "
                           "waits for the others until options::timeout)");
  }
}

/// Runs `action` with the parameters of `models[first...]` whole (a policy that shards parameters gathers them for
/// the while, on every process), keeping what it writes into them.
template <class Parallel, class Action>
void with_full_weights(Parallel& parallel, const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                       Action&& action, std::size_t first = 0) {
  if (first == models.size()) return std::forward<Action>(action)();
  parallel.with_full_parameters(*models[first], [&] { with_full_weights(parallel, models, action, first + 1); });
}

/// The weights `save_state` writes: each model's parameters and buffers by name (none in the sharded format, where
/// each process writes its shards of every model), as the save_state pre-hooks, run on every process in registration
/// order, left them. A hook that throws fails the save on every process before anything is written.
template <class Parallel>
std::vector<safetensors::tensor_list> hooked_weights(Parallel& parallel, const prepared_registry& registry,
                                                     const checkpoint_settings& settings,
                                                     const std::filesystem::path& directory, bool sharded) {
  std::vector<safetensors::tensor_list> weights;
  for (std::size_t i = 0; !sharded && i < registry.models().size(); ++i)
    weights.push_back(state_of(*registry.models()[i]));
  on_every_process_or_none(parallel, "save_state", "running the save_state pre-hooks", [&] {
    settings.save_hooks.run(registry.models(), weights, directory);
    if (sharded && !weights.empty())
      throw checkpoint_error(
          "accel::save_state: a save_state pre-hook added weights, but in the sharded format "
          "(options::sharding.state_dict = state_dict_type::sharded) every process writes its shards of every model "
          "and the hooks get no weights to change; write other files from the hook itself");
  });
  return weights;
}

/// What a process that does not see the staging directory its writer made is told, where it must see it.
inline checkpoint_error unseen_directory(const std::filesystem::path& partial, int process, bool sharded) {
  return checkpoint_error(
      "accel::save_state: process " + std::to_string(process) + " does not see " + partial.string() + ", which " +
      (sharded ? "process 0 made: in the sharded format every process writes its shard files into the checkpoint, "
                 "so its directory must be on a file system every process sees"
               : "its machine's local main process made: with options::project.save_on_each_node the processes of a "
                 "machine must have local_process_index() 0 to local_world_size - 1 there, as accel launch and "
                 "torchrun number them"));
}

/// The `random_states_{rank}.bin` files of the processes that do not see the main process's staging directory (one
/// on a disk their machine does not share), sent to the main process, which writes them: its checkpoint is whole.
/// One all-reduce when every process sees it.
template <class Parallel>
void write_unseen_files(Parallel& parallel, const std::filesystem::path& partial, const std::string& unwritten,
                        bool writer) {
  if (!on_any_process(parallel, !unwritten.empty())) return;
  auto&& comm = parallel.communicator();
  const auto files = all_gather_bytes(comm, std::vector<char>(unwritten.begin(), unwritten.end()));
  on_every_process_or_none(
      parallel, "save_state", "writing the files of processes that do not see " + partial.string(), [&] {
        if (!writer) return;
        for (std::size_t p = 0; p < files.size(); ++p)
          if (!files[p].empty())
            write_atomically<checkpoint_error>(partial / process_file(static_cast<int>(p)),
                                               [&](auto& out) { out.write(files[p].data(), files[p].size()); });
      });
}

/// Writes a checkpoint into `directory`, atomically; in the sharded format (`sharded`), or in the full one, the
/// weights whole (with_full_weights). The shared files are written by the main process, or with
/// `save_on_each_node` by each machine's local main process into its own disk's directory; every process writes
/// its `random_states_{rank}.bin` there.
template <class Parallel, class... Policies>
void save_checkpoint(const std::filesystem::path& directory, bool sharded, bool safe_serialization, Parallel& parallel,
                     const prepared_registry& registry, const checkpoint_settings& settings,
                     const Policies&... policies) {
  const auto slots = registry.slots_by_kind();
  for (const auto& [kind, list] : slots)  // on every process, so that none is left at a barrier
    for (std::size_t i = 0; i < list.size(); ++i)
      if (!list[i]->save)
        throw checkpoint_error("accel::save_state: " + kind + " " + std::to_string(i) +
                               " cannot be checkpointed: give it save(OutputArchive&) const and load(InputArchive&)");
  const bool on_each_node = settings.project.save_on_each_node;
  if (sharded && on_each_node)
    throw checkpoint_error(
        "accel::save_state: options::project.save_on_each_node writes a whole checkpoint on each machine, which the "
        "sharded format (options::sharding.state_dict = state_dict_type::sharded) cannot: each process writes only "
        "its own shards; use state_dict_type::full with save_on_each_node, or a file system every machine sees");
  const bool writer = writes_shared_files(settings.project, parallel);
  const auto target = checkpoint_directory(directory);
  const auto partial = std::filesystem::path(target.string() + ".partial");
  const auto weights = hooked_weights(parallel, registry, settings, directory, sharded);
  std::optional<staging_directory> staging;
  const auto discard_on_failure = scope_fail([&] {
    if (staging) staging->discard();
  });
  on_every_process_or_none(parallel, "save_state", "preparing " + partial.string(), [&] {
    if (!writer) return;
    std::filesystem::create_directories(target.parent_path());
    try {
      staging.emplace(target);
    } catch (const staging_busy& e) {
      if (!on_each_node) throw;
      throw staging_busy(std::string(e.what()) +
                         "; with options::project.save_on_each_node each machine's local main process saves into the "
                         "directory on its own disk: on a file system the machines share, leave it off");
    }
  });
  checkpoint_manifest manifest;
  std::vector<written_file> mine;
  std::string unwritten;  // this process's random states, when it does not see `partial`: the main process writes them
  on_every_process_or_none(parallel, "save_state", "writing its part of the checkpoint", [&] {
    auto state = process_state(slots, policies...);
    const auto name = process_file(parallel.process_index());
    const bool sees_directory = writer || std::filesystem::is_directory(partial);
    if (sees_directory) {
      mine.push_back(write_atomically<checkpoint_error>(partial / name, [&](auto& out) { out.write(state); }));
    } else {
      mine.push_back({name, state.size(), crc32c(state)});
      unwritten = std::move(state);
    }
    if (sharded && sees_directory) {
      for (auto& file : save_shards(partial, parallel, registry, slots, manifest)) mine.push_back(std::move(file));
    } else if (!sharded) {
      save_optimizers(partial, parallel, registry, manifest, writer);  // collectives under the sharded policies
      if (writer) {
        save_shared_state(partial, parallel.num_processes(), weights.size(), registry, slots, manifest);
        save_models(partial, weights, manifest, safe_serialization);
      }
    }
    if (!sees_directory && (sharded || on_each_node))
      throw unseen_directory(partial, parallel.process_index(), sharded);
  });
  write_unseen_files(parallel, partial, unwritten, writer);
  std::vector<std::vector<std::string>> names;
  for (int process = 0; process < parallel.num_processes(); ++process)
    names.push_back(process_file_names(process, registry, sharded));
  gather_process_files(parallel, mine, names, manifest);
  on_every_process_or_none(parallel, "save_state", "putting " + target.string() + " in place", [&] {
    if (!writer) return;
    write_atomically<checkpoint_error>(partial / manifest_name, [&](auto& out) { out.write(manifest.text()); });
    staging->install();
  });
}

/// Saves the training state into `directory`, atomically: every process writes its part into the locked staging
/// directory `directory.partial` (detail/checkpoint_directory.hpp), the writers add the manifest of sizes and
/// checksums, and the staging directory replaces the old checkpoint, keeping what accel did not write. The
/// save_state pre-hooks run first. A failure on any process raises on every process and leaves the previous
/// checkpoint as it was. A collective. Without `safe_serialization`, the full format's model files are pickled
/// (`model_file`); the sharded format's shards are safetensors either way.
template <class Parallel, class... Policies>
void save_state(const std::filesystem::path& directory, bool safe_serialization, Parallel& parallel,
                const prepared_registry& registry, const checkpoint_settings& settings, const Policies&... policies) {
  as_collective("save_state", [&] {
    if (parallel.checkpoint_format() == state_dict_type::sharded)  // nothing gathered
      return save_checkpoint(directory, true, true, parallel, registry, settings, policies...);
    with_full_weights(parallel, registry.models(), [&] {
      save_checkpoint(directory, false, safe_serialization, parallel, registry, settings, policies...);
    });
  });
}

/// Loads objects that can also save what they hold, all or none: before an object loads, its current state is kept
/// (serialised in memory); should a later load fail, every object loaded before it gets its state back. Objects
/// loaded into a freshly built program hold little, so the copies are small.
class load_transaction {
 public:
  load_transaction() = default;
  load_transaction(const load_transaction&) = delete;
  load_transaction& operator=(const load_transaction&) = delete;
  ~load_transaction() {
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) try {
        (*it)();
      } catch (...) {  // the state kept a moment ago loads; should it not, there is nothing better to do
      }
  }

  /// Loads `source` with `load`, having kept what `save` writes now, which `restore` (by default `load`) puts back
  /// should a later load fail; `what` names the object in an error.
  template <class Save, class Load>
  void load(const std::string& what, Save save, Load load, torch::serialize::InputArchive& source) {
    this->load(what, std::move(save), load, source, load);
  }
  template <class Save, class Load, class Restore>
  void load(const std::string& what, Save save, Load load, torch::serialize::InputArchive& source, Restore restore) {
    torch::serialize::OutputArchive before;
    save(before);
    auto bytes = std::make_shared<std::stringstream>();
    before.save_to(*bytes);
    try {
      load(source);
    } catch (const checkpoint_error& e) {
      throw checkpoint_error("accel::load_state: " + what + " " + e.what() + "; nothing was loaded");
    } catch (const std::exception& e) {
      throw checkpoint_error("accel::load_state: " + what + " does not fit the object it is loaded into (saved " +
                             "from another kind of object, or a damaged file?): " + first_line(e.what()) +
                             "; nothing was loaded");
    }
    undo_.emplace_back([bytes, restore] {
      torch::serialize::InputArchive previous;
      previous.load_from(*bytes);
      restore(previous);
    });
  }
  /// Keeps what was loaded.
  void commit() noexcept { undo_.clear(); }

 private:
  std::vector<std::function<void()>> undo_;
};

/// Every generator state in `states` fits its generator: tried on a copy of it, so that nothing changes.
inline void check_generator_states(const std::vector<std::pair<at::Generator, at::Tensor>>& states,
                                   const std::string& file) {
  for (const auto& [generator, state] : states) try {
      generator.clone().set_state(state);
    } catch (const std::exception& e) {
      throw checkpoint_error("accel::load_state: " + file + " holds a damaged " + generator.device().str() +
                             " generator state (" + first_line(e.what()) + "); nothing was loaded");
    }
}

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
    throw checkpoint_error("accel::load_state: accel_state.bin says " + std::to_string(saved_processes) +
                           " processes wrote the checkpoint (a damaged file?)");
  if (saved_processes == processes) return {process, process};
  return {0, process < saved_processes ? std::optional<int>(process) : std::nullopt};
}

/// `load_state` with the weights whole, into `models` (what the load_state pre-hooks left; `hooked`: there are
/// such hooks), the optimizers' state read to `read_to`.
template <class Parallel, class... Policies>
void load_full_state(const std::filesystem::path& directory,
                     const std::vector<std::shared_ptr<torch::nn::Module>>& models, const c10::Device& read_to,
                     bool hooked, Parallel& parallel, const prepared_registry& registry, Policies&... policies) {
  if (!std::filesystem::is_directory(directory))
    throw checkpoint_error("accel::load_state: no checkpoint at " + directory.string());
  const auto manifest = read_manifest(directory);
  auto shared = read_archive(directory, "accel_state.bin", manifest);
  const auto count = [&](const std::string& key) {
    c10::IValue value;
    if (!shared.try_read(key, value) || !value.isInt())
      throw checkpoint_error("accel::load_state: " + (directory / "accel_state.bin").string() + " lacks \"" + key +
                             "\"");
    return value.toInt();
  };
  const auto expect = [&](const std::string& key, std::int64_t mine) {
    if (count(key) != mine)
      throw checkpoint_error("accel::load_state: the checkpoint in " + directory.string() + " has " +
                             std::to_string(count(key)) + " " + key + ", this program " + std::to_string(mine) +
                             (key == "models" && hooked ? " after its load_state pre-hooks (which must remove the "
                                                          "models whose weights its save_state pre-hooks removed)"
                                                        : "") +
                             "; prepare the same objects, in the same order, as when saving");
  };
  const auto optimizers = registry.optimizers();
  const auto slots = registry.slots_by_kind();
  const auto files = process_files_to_read(count("processes"), parallel.process_index(), parallel.num_processes());
  expect("models", static_cast<std::int64_t>(models.size()));
  expect("optimizers", static_cast<std::int64_t>(optimizers.size()));
  for (const auto& [kind, list] : slots) expect(kind, static_cast<std::int64_t>(list.size()));
  for (const auto& key : shared.keys())
    if (key != "processes" && key != "models" && key != "optimizers" && !slots.contains(key))
      expect(key, 0);  // the checkpoint holds objects of a kind this program did not prepare
  // Read and check everything before changing anything. A sharded checkpoint's weights and optimizer states are
  // assembled whole from every process's files (shard_files.hpp), then load as a full checkpoint's.
  const auto sharded = shard_layout_table::load(directory, manifest);
  if (sharded && (sharded->processes != count("processes") || sharded->models.size() != models.size()))
    throw checkpoint_error("accel::load_state: " + (directory / shard_layout_name).string() +
                           " does not match accel_state.bin (a damaged checkpoint?)");
  std::vector<std::map<std::string, at::Tensor>> weights;
  for (std::size_t i = 0; i < models.size(); ++i) {
    auto [loaded, name] = sharded
                              ? std::pair{assemble_model(directory, manifest, *sharded, i), shard_file("model", i, 0)}
                              : read_model_weights(directory, i, manifest);
    const auto file = directory / name;
    weights.emplace_back(loaded.begin(), loaded.end());
    check_weights_fit(*models[i], weights.back(),
                      "accel::load_state: the weights in " + file.string() + " do not fit the prepared model");
  }
  std::vector<std::map<std::string, at::Tensor>> optimizer_states;
  for (std::size_t i = 0; sharded && i < optimizers.size(); ++i) {
    optimizer_states.push_back(assemble_optimizer_state(directory, manifest, *sharded, i));
    for (auto& [name, tensor] : optimizer_states.back()) tensor = tensor.to(read_to);  // map_location
  }
  const auto file = process_file(files.state);
  auto mine = read_archive(directory, file, manifest);
  const auto lacks = [&](const std::string& what) {
    return checkpoint_error("accel::load_state: " + file + " lacks " + what + " (saved by another configuration?)");
  };
  std::vector<torch::serialize::InputArchive> optimizer_archives;
  for (std::size_t i = 0; i < optimizers.size(); ++i)
    optimizer_archives.push_back(read_archive(directory, numbered("optimizer", i, ".bin"), manifest, read_to));
  std::map<std::string, std::vector<torch::serialize::InputArchive>> slot_archives;
  for (const auto& [kind, list] : slots)
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (list[i]->scope == state_scope::shared) {
        slot_archives[kind].push_back(read_archive(directory, numbered(kind, i, ".bin"), manifest));
      } else {
        slot_archives[kind].emplace_back();
        if (!mine.try_read(kind + "_" + std::to_string(i), slot_archives[kind].back()))
          throw lacks(kind + " " + std::to_string(i) + "'s position");
      }
    }
  std::vector<std::pair<at::Generator, at::Tensor>> generator_states;
  if (files.generators) {
    const auto generators_file = process_file(*files.generators);
    std::optional<torch::serialize::InputArchive> other;
    auto& own =
        *files.generators == files.state ? mine : other.emplace(read_archive(directory, generators_file, manifest));
    for (auto& [key, generator] : generators()) {
      at::Tensor state;
      if (own.try_read(key, state))
        generator_states.emplace_back(generator, state);
      else if (key == "cpu_rng")
        throw checkpoint_error("accel::load_state: " + generators_file + " lacks the CPU generator state");
    }
    check_generator_states(generator_states, generators_file);
  }
  // Apply: what can fail to load goes first, all or none; then what was checked above.
  load_transaction transaction;
  const auto load_policy = [&](auto& policy) {
    if constexpr (stateful_policy<std::remove_cvref_t<decltype(policy)>>)
      transaction.load(
          file, [p = &policy](torch::serialize::OutputArchive& out) { p->save_state(out); },
          [p = &policy](torch::serialize::InputArchive& in) { p->load_state(in); }, mine);
  };
  (load_policy(policies), ...);
  // A sharded checkpoint names each state by its parameter's name in its model.
  std::map<const void*, std::string> state_names;
  for (std::size_t m = 0; sharded && m < models.size(); ++m)
    for (const auto& item : models[m]->named_parameters())
      state_names.emplace(item.value().unsafeGetTensorImpl(), state_field_name(m, item.key(), ""));
  const auto state_name = [&state_names](const at::Tensor& parameter) {
    const auto found = state_names.find(parameter.unsafeGetTensorImpl());
    return found == state_names.end() ? std::string() : found->second;
  };
  for (std::size_t i = 0; i < optimizers.size(); ++i) {
    auto* optimizer = optimizers[i];
    // What is loaded is a whole state, which the parallel policy may shard; what is kept to undo is the
    // optimizer's own state, put back as it is.
    transaction.load(
        numbered("optimizer", i, ".bin"),
        [optimizer](torch::serialize::OutputArchive& out) { save_optimizer(*optimizer, out); },
        [&, optimizer, i](torch::serialize::InputArchive& in) {
          parallel.load_whole_optimizer(*optimizer, [&] {
            load_optimizer(*optimizer, in);
            if (sharded) set_whole_state(*optimizer, optimizer_states[i], state_name);
          });
          place_state_on_parameters(*optimizer, read_to);
        },
        optimizer_archives[i], [optimizer](torch::serialize::InputArchive& in) { load_optimizer(*optimizer, in); });
  }
  for (const auto& [kind, list] : slots)
    for (std::size_t i = 0; i < list.size(); ++i)
      transaction.load(kind + " " + std::to_string(i) + "'s state in the checkpoint", list[i]->save, list[i]->load,
                       slot_archives[kind][i]);
  transaction.commit();
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < models.size(); ++i) copy_weights(*models[i], weights[i]);
  for (auto& [generator, state] : generator_states) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
}

/// The models `load_state` loads: every prepared model, less those the load_state pre-hooks, run on every process in
/// registration order, removed (to load them themselves). A sharded checkpoint's shards load into every model, so
/// there the hooks get none (as Accelerate's do under FSDP). With hooks, one all-reduce: a hook that throws fails
/// the load on every process, before anything is read.
template <class Parallel>
std::vector<std::shared_ptr<torch::nn::Module>> hooked_models(Parallel& parallel, const prepared_registry& registry,
                                                              const checkpoint_settings& settings,
                                                              const std::filesystem::path& directory) {
  if (settings.load_hooks.empty()) return registry.models();
  const bool sharded = std::filesystem::exists(directory / shard_layout_name);
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

/// Where `load_state` reads the optimizers' state to: `where`, by default (Accelerate's) `on_device` when several
/// processes each have a device of their own (not the CPU), else `cpu`.
inline c10::Device read_device(std::optional<map_location> where, int processes, const c10::Device& device) {
  const auto chosen = where.value_or(processes > 1 && !device.is_cpu() ? map_location::on_device : map_location::cpu);
  return chosen == map_location::on_device ? device : c10::Device(c10::kCPU);
}

/// `{project_dir}/checkpoints`, where the automatic checkpoints go.
inline std::filesystem::path checkpoints_root(const project_options& project) {
  return std::filesystem::path(project.project_dir) / "checkpoints";
}

/// After `load_state(directory)`: when `directory` is the project's `checkpoint_{k}`, the next automatic save is
/// `checkpoint_{k + 1}`.
inline void count_from_loaded(checkpoint_settings& settings, const std::filesystem::path& directory) {
  auto path = std::filesystem::absolute(directory).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  const auto number = checkpoint_number(path.filename().string());
  std::error_code error;
  if (!number || *number == std::numeric_limits<std::int64_t>::max() ||
      !std::filesystem::equivalent(path.parent_path(), checkpoints_root(settings.project), error))
    return;
  settings.next_number = *number + 1;
}

/// Restores what `save_state` wrote. The load_state pre-hooks run first; then everything is read and checked (the
/// files, the number of processes and of each kind of object, every weight's name, shape and dtype, every generator
/// state); then the policies, optimizers and slots load all or none; the weights and generators, checked, go last. A
/// problem throws `checkpoint_error`, and the program's state is as it was. The optimizers' state is read where
/// `where` says (`read_device`) and placed on its parameters' devices.
template <class Parallel, class... Policies>
void load_state(const std::filesystem::path& directory, std::optional<map_location> where, Parallel& parallel,
                const prepared_registry& registry, checkpoint_settings& settings, Policies&... policies) {
  const auto read_to = read_device(where, parallel.num_processes(), parallel.device());
  as_collective("load_state", [&] {
    with_full_weights(parallel, registry.models(), [&] {
      const auto models = hooked_models(parallel, registry, settings, directory);
      load_full_state(directory, models, read_to, !settings.load_hooks.empty(), parallel, registry, policies...);
    });
  });
  count_from_loaded(settings, directory);
}

/// The number the next `save_state()` writes, as this process sees it: the one fixed (`project.iteration`, then the
/// number after each automatic save, or after the `checkpoint_{k}` loaded), else one above the highest
/// `checkpoint_{i}` under the project's checkpoints directory (0 when there is none).
inline std::int64_t next_checkpoint_number(const checkpoint_settings& settings) {
  if (settings.next_number) return *settings.next_number;
  const auto existing = numbered_checkpoints(checkpoints_root(settings.project));
  if (existing.empty()) return 0;
  if (existing.rbegin()->first == std::numeric_limits<std::int64_t>::max())
    throw checkpoint_error("accel::save_state(): " + existing.rbegin()->second.string() +
                           " has the largest number a checkpoint can have; move the checkpoints away to go on");
  return existing.rbegin()->first + 1;
}

/// The number of the next automatic checkpoint, the same on every process (a collective): the one fixed, refused on
/// every process when a process sees its directory already; else one above the highest any process sees.
template <class Parallel>
std::int64_t agree_on_checkpoint_number(const checkpoint_settings& settings, Parallel& parallel) {
  std::int64_t next = 0;
  on_every_process_or_none(parallel, "save_state", "choosing the checkpoint's number", [&] {
    next = next_checkpoint_number(settings);
    const auto directory = checkpoints_root(settings.project) / ("checkpoint_" + std::to_string(next));
    if (settings.next_number && std::filesystem::exists(std::filesystem::symlink_status(directory)))
      throw checkpoint_error("accel::save_state(): " + directory.string() + " already exists (save_iteration() is " +
                             std::to_string(next) +
                             "): an automatic save never replaces a checkpoint; move it away, or number on from "
                             "another checkpoint with acc.set_save_iteration(n) (options::project.iteration at start)");
  });
  if (settings.next_number) return next;
  auto&& comm = parallel.communicator();
  return reduce(comm, at::full({1}, next, at::kLong), reduction::max).template item<std::int64_t>();
}

/// `save_state` into the project's next automatic checkpoint, `{project_dir}/checkpoints/checkpoint_{i}` (i:
/// `agree_on_checkpoint_number`), then removes the oldest beyond `total_limit`. Returns the directory written.
template <class Parallel, class... Policies>
std::filesystem::path save_numbered_state(checkpoint_settings& settings, bool safe_serialization, Parallel& parallel,
                                          const prepared_registry& registry, const Policies&... policies) {
  const auto& project = settings.project;
  if (!project.automatic_checkpoint_naming)
    throw std::invalid_argument(
        "accel::save_state(): without a directory it needs "
        "options::project.automatic_checkpoint_naming; or pass the directory to save to");
  const auto root = checkpoints_root(project);
  auto existing = numbered_checkpoints(root);
  std::int64_t next = 0;
  as_collective("save_state", [&] { next = agree_on_checkpoint_number(settings, parallel); });
  const auto directory = root / ("checkpoint_" + std::to_string(next));
  save_state(directory, safe_serialization, parallel, registry, settings, policies...);
  if (settings.next_number) settings.next_number = next + 1;
  // Only now that the new checkpoint is complete and synced: a save that fails (a full disk) loses no checkpoint.
  // Each writer prunes its own directory (each machine's, with save_on_each_node).
  on_every_process_or_none(parallel, "save_state", "removing checkpoints beyond total_limit", [&] {
    if (!writes_shared_files(project, parallel) || project.total_limit <= 0) return;
    for (; !existing.empty() && static_cast<int>(existing.size()) + 1 > project.total_limit;
         existing.erase(existing.begin()))
      remove_checkpoint_files(existing.begin()->second);  // what accel did not write stays
  });
  return directory;
}

/// The project's newest complete automatic checkpoint (one with its manifest: a directory whose removal beyond
/// `total_limit` was cut short is passed over), if any.
inline std::optional<std::filesystem::path> newest_complete_checkpoint(const project_options& project) {
  const auto existing = numbered_checkpoints(checkpoints_root(project));
  for (auto it = existing.rbegin(); it != existing.rend(); ++it)
    if (std::filesystem::is_regular_file(it->second / manifest_name)) return it->second;
  return std::nullopt;
}
inline std::filesystem::path newest_checkpoint(const project_options& project) {
  if (auto newest = newest_complete_checkpoint(project)) return *newest;
  throw checkpoint_error("accel::load_state(): no complete checkpoint_{i} under " + checkpoints_root(project).string());
}

}  // namespace accel::detail

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
  auto shared = detail::read_archive(checkpoint, "accel_state.bin", manifest);
  c10::IValue models;
  if (!shared.try_read("models", models) || !models.isInt() || models.toInt() < 0)
    throw checkpoint_error("accel::merge_weights: " + (checkpoint / "accel_state.bin").string() +
                           " lacks the number of models (a damaged file?)");
  const auto sharded = detail::shard_layout_table::load(checkpoint, manifest);
  std::filesystem::create_directories(out);
  std::vector<std::filesystem::path> written;
  for (std::size_t i = 0; i < static_cast<std::size_t>(models.toInt()); ++i) {
    const auto name = detail::model_file(i, true);
    const auto tensors = sharded ? detail::assemble_model(checkpoint, manifest, *sharded, i)
                                 : detail::read_model_weights(checkpoint, i, manifest).first;
    safetensors::save(out / name, tensors);
    written.push_back(out / name);
  }
  return written;
}

}  // namespace accel
