/// \file
/// What an accelerator keeps for its checkpoints besides the prepared objects and the policies: the project options,
/// the pre-hooks (Accelerate's `register_save_state_pre_hook` / `register_load_state_pre_hook`) and the number of
/// the next automatic checkpoint; and `map_location`, where `load_state` reads optimizer state to.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../../options.hpp"
#include "../../removable_handle.hpp"
#include "../../safetensors.hpp"

namespace torch::nn {
class Module;
}

namespace accel {

/// Where `load_state` reads the optimizers' state to (Accelerate's `map_location`): into CPU memory (`cpu`), or
/// straight onto the accelerator's `device()` (`on_device`). Either way each state tensor ends on its parameter's
/// device, where PyTorch's `load_state_dict` puts it (LibTorch's `Optimizer::load` leaves it where it was read to).
enum class map_location { cpu, on_device };

/// `load_state`'s options: where the optimizers' state is read to (`map_location`), and whether a checkpoint without a
/// manifest (`accel_checksums.txt`: one written by accel 0.1) may load, its files unchecked. Without a manifest
/// nothing vouches for the files before LibTorch parses them, and LibTorch 1.13's reader can crash the process on a
/// damaged one: load such a checkpoint once with `allow_unchecked`, then save it again to give it a manifest.
struct load_options {
  std::optional<accel::map_location> map_location = std::nullopt;
  bool allow_unchecked = false;
};

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

/// The project options, the pre-hooks, and the number of the next automatic checkpoint once that is fixed
/// (Accelerate's `save_iteration`: `project.iteration`, then the number after each automatic save or after the
/// `checkpoint_{k}` loaded).
struct checkpoint_settings {
  ACCEL_DECL explicit checkpoint_settings(const project_options& options);
  /// Refuses a number no checkpoint can have; `what` names where it came from.
  ACCEL_DECL static void check_checkpoint_number(std::int64_t number, const std::string& what);

  project_options project;
  hook_list<save_state_pre_hook> save_hooks;
  hook_list<load_state_pre_hook> load_hooks;
  std::optional<std::int64_t> next_number;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/settings.ipp"
#endif
