/// \file
/// `training_state`: everything a checkpoint holds, as one object the accelerator builds once. It knows the parallel
/// policy (every save and load is a collective over it), the registry of prepared objects, the checkpoint settings,
/// and the participants: the policies and objects that keep state of their own in each process's file (anything
/// with `save_state(archive) const` / `load_state(archive)`). `save_state`, `load_state`, `join_uneven_inputs`'s
/// sharing of the last process's state and `free_memory` all go through it, so the participants are listed once.
/// Reading and writing checkpoints is `checkpoint_io` (checkpoint_io.hpp, which accel/checkpoint.hpp includes): a
/// loop that never saves compiles none of it.
// IWYU pragma: private, include <accel/accelerator.hpp>
#pragma once

#include <c10/core/Device.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "../../collectives.hpp"
#include "../../concepts.hpp"
#include "../prepared/registry.hpp"
#include "../support/archive.hpp"
#include "background.hpp"
#include "optimizer_archive.hpp"
#include "settings.hpp"

namespace accel::detail {

class snapshot_buffers;
/// Reads and writes the checkpoints of one `training_state`: defined for it in checkpoint_io.hpp, which
/// accel/checkpoint.hpp includes. This primary template names that include where it is missing.
template <class State>
class checkpoint_io {
  static_assert(sizeof(State) == 0,
                "accel::accelerator's save_state, load_state, save_iteration and load_model need "
                "#include <accel/checkpoint.hpp>");
};

/// `participant` in a tuple of one reference when it has state of its own (`stateful_policy`), else an empty tuple.
template <class Participant>
auto reference_if_stateful(Participant& participant) {
  if constexpr (stateful_policy<Participant>)
    return std::tuple<Participant&>(participant);
  else
    return std::tuple<>();
}

/// The training state of one accelerator: `Parallel` for the collectives, `Participants` for the state each process
/// keeps of its own. Only those that are `stateful_policy` are kept (the others have nothing to save), so an empty
/// policy costs nothing here either.
template <class Parallel, class... Participants>
class training_state {
 public:
  training_state(Parallel& parallel, prepared_registry& registry, const project_options& project,
                 Participants&... participants)
      : parallel_(parallel),
        registry_(registry),
        settings_(project),
        participants_(std::tuple_cat(reference_if_stateful(participants)...)) {}
  training_state(const training_state&) = delete;
  training_state& operator=(const training_state&) = delete;

  [[nodiscard]] checkpoint_settings& settings() noexcept { return settings_; }
  [[nodiscard]] const checkpoint_settings& settings() const noexcept { return settings_; }

  /// Waits for the asynchronous save in flight: the directory it wrote, or its failure raised (on every process,
  /// which agreed on it); none when there was none.
  std::optional<std::filesystem::path> finish_background_save() { return background_.finish(); }

  /// Every process takes process `source`'s copy of what a checkpoint saves once for the job (each optimizer's state
  /// with its learning rates, the shared slots: schedulers and registered objects) and of every participant's state,
  /// sent instead of written: after join_uneven_inputs, the processes that stopped early take the state of the last
  /// to stop, so that every process goes on from the same state. A collective.
  void share_from(int source) {
    for (auto* optimizer : registry_.optimizers())
      share(
          source, [optimizer](auto& out) { save_optimizer(*optimizer, out); },
          [optimizer](auto& in) {
            load_optimizer(*optimizer, in);
            place_state_on_parameters(*optimizer, c10::Device(c10::kCPU));
          });
    for (const auto& [kind, list] : registry_.slots_by_kind())
      for (const auto& slot : list)
        if (slot->scope == state_scope::shared && slot->save) share(source, slot->save, slot->load);
    for_each_stateful([&](auto& participant) {
      share(
          source, [&participant](auto& out) { participant.save_state(out); },
          [&participant](auto& in) { participant.load_state(in); });
    });
  }

  /// Forgets every prepared object and model (`free_memory`); registered objects stay.
  void release_prepared() {
    registry_.release_prepared();
    parallel_.release_models();
  }

 private:
  template <class State>
  friend class checkpoint_io;

  /// Runs `f` on each participant with state of its own, in the order they were given.
  template <class F>
  void for_each_stateful(F&& f) {
    std::apply([&f](auto&... participant) { (f(participant), ...); }, participants_);
  }

  /// Process `source`'s `save` of one object, broadcast and loaded with `load` by every other process. Read to the
  /// CPU: the sender's tensors name its device, which is another process's GPU under NCCL.
  template <class Save, class Load>
  void share(int source, const Save& save, const Load& load) {
    auto&& comm = parallel_.communicator();
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
  }

  Parallel& parallel_;
  prepared_registry& registry_;
  checkpoint_settings settings_;
  decltype(std::tuple_cat(reference_if_stateful(std::declval<Participants&>())...)) participants_;
  std::shared_ptr<snapshot_buffers> buffers_;  // an asynchronous save's copies, kept for the next; made by the first
  background_save background_;                 // last: destroyed first, it waits for the thread that reads buffers_
};

}  // namespace accel::detail
