/// \file
/// `checkpoint_slot`: how one prepared or registered object (a scheduler, a range's data position, a user's object)
/// is saved into and loaded from a checkpoint archive, and whether its state is the job's or each process's.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
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
  /// The state as PyTorch's `state_dict` of the same object holds it (Accelerate's checkpoints, docs/python.md);
  /// empty functions: the object has no PyTorch counterpart accel maps it onto.
  std::function<void(const c10::IValue&, const std::string&)> load_python = {};
  std::function<c10::IValue()> save_python = {};
};

/// LibTorch's schedulers keep their step count in a protected member; a derived class may name it.
struct lr_scheduler_access : torch::optim::LRScheduler {
  static unsigned& step_count(torch::optim::LRScheduler& scheduler) {
    return scheduler.*(&lr_scheduler_access::step_count_);
  }
  static unsigned step_count(const torch::optim::LRScheduler& scheduler) {
    return scheduler.*(&lr_scheduler_access::step_count_);
  }
  static std::vector<double> current_lrs(const torch::optim::LRScheduler& scheduler) {
    return (scheduler.*(&lr_scheduler_access::get_current_lrs))();
  }
};

/// PyTorch's `StepLR.state_dict()` keys: what a LibTorch `StepLR` has (its step count; its step size, factor and
/// base learning rates are the program's own, given to its constructor) and what PyTorch keeps beside.
ACCEL_DECL const std::set<std::string>& python_step_lr_keys();

/// Loads PyTorch's `StepLR` state (`saved`, from `file`) into a LibTorch `StepLR`: PyTorch counts the step its
/// constructor makes in `_step_count` and LibTorch does not, but LibTorch's `StepLR` decays one step later, so
/// LibTorch's count equal to `_step_count` decays on exactly the steps PyTorch's would. The learning rates travel
/// with the optimizer.
ACCEL_DECL void load_python_step_lr(torch::optim::StepLR& scheduler, const c10::IValue& saved, const std::string& file);

/// A LibTorch `StepLR`'s state as PyTorch's `StepLR.load_state_dict` takes it (the inverse of
/// `load_python_step_lr`). Its step size, factor and base learning rates are left out: PyTorch's `load_state_dict`
/// updates only the keys given, so the Python program's own stay.
ACCEL_DECL c10::IValue python_step_lr_state(const torch::optim::StepLR& scheduler);

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
    if constexpr (std::is_same_v<T, torch::optim::StepLR>) {
      slot.load_python = [&object](const c10::IValue& saved, const std::string& file) {
        load_python_step_lr(object, saved, file);
      };
      slot.save_python = [&object] { return python_step_lr_state(object); };
    }
  }
  return slot;
}

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/slot.ipp"
#endif
