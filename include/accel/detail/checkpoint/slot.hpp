/// \file
/// `checkpoint_slot`: how one prepared or registered object (a scheduler, a range's data position, a user's object)
/// is saved into and loaded from a checkpoint archive, and whether its state is the job's or each process's.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>

#include "../support/archive.hpp"
#include "format.hpp"

namespace accel::detail {

/// Where a slot's state goes: one file the main process writes for the job (`scheduler.bin`), or every process's
/// own `random_states_{rank}.bin` (a range's data position: each process reads its own shard).
enum class state_scope { shared, per_process };

/// Empty functions: the object cannot be checkpointed (`save_state` says which).
struct checkpoint_slot {
  std::string kind;  // one of format.hpp's kinds: the file stem (shared) or archive key (per process)
  state_scope scope = state_scope::shared;
  std::function<void(torch::serialize::OutputArchive&)> save = {};
  std::function<void(torch::serialize::InputArchive&)> load = {};
};

/// LibTorch's schedulers keep their step count in a protected member; a derived class may name it.
struct lr_scheduler_access : torch::optim::LRScheduler {
  static unsigned& step_count(torch::optim::LRScheduler& scheduler) {
    return scheduler.*(&lr_scheduler_access::step_count_);
  }
};

/// `archive_serialisable` objects; LibTorch LR schedulers (their step count; learning rates travel with the
/// optimizer); else not checkpointable.
/// `object` must not move while the slot lives (prepared objects keep what they own in place: `pinned`).
template <class T>
checkpoint_slot slot_for(std::string_view kind, T& object) {
  checkpoint_slot slot{.kind = std::string(kind)};
  if constexpr (archive_serialisable<T>) {
    slot.save = [&object](torch::serialize::OutputArchive& out) { object.save(out); };
    slot.load = [&object](torch::serialize::InputArchive& in) { object.load(in); };
  } else if constexpr (std::is_base_of_v<torch::optim::LRScheduler, T>) {
    slot.save = [&object](torch::serialize::OutputArchive& out) {
      out.write("step_count", c10::IValue(static_cast<std::int64_t>(lr_scheduler_access::step_count(object))));
    };
    slot.load = [&object](torch::serialize::InputArchive& in) {
      c10::IValue count;
      in.read("step_count", count);
      lr_scheduler_access::step_count(object) = static_cast<unsigned>(count.toInt());
    };
  }
  return slot;
}

}  // namespace accel::detail
