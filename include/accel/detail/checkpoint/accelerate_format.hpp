/// \file
/// Checkpoints in Accelerate's own file set (docs/python.md): `model.safetensors` (or `pytorch_model.bin`),
/// `optimizer.bin` and `scheduler.bin` (`torch.save` of PyTorch's `state_dict()`s) and `random_states_{i}.pkl`
/// (`torch.save` of the generator states), as Accelerate 1.15's `save_state` writes them and its `load_state` reads
/// them. `accelerate_reader` reads one for `load_state` into what it applies; `write_accelerate_checkpoint` writes
/// one (`save_state` with `file_set::accelerate`).
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "../../model_weights.hpp"
#include "../../safetensors.hpp"
#include "../prepared/registry.hpp"
#include "../support/atomic_file.hpp"
#include "../support/generators.hpp"
#include "format.hpp"
#include "manifest.hpp"
#include "python_optimizer.hpp"
#include "python_pickle.hpp"
#include "reader.hpp"

namespace accel::detail {

/// Accelerate's name for each process's generator states: `random_states_{i}.pkl`.
inline std::string accelerate_random_states(int process) { return "random_states_" + std::to_string(process) + ".pkl"; }

/// Whether `directory` holds a checkpoint in Accelerate's file set: none of accel's own files (`accel_state.bin`,
/// the manifest), and Accelerate's first model file or generator states. So `load_state` needs no flag to tell.
ACCEL_DECL bool is_accelerate_checkpoint(const std::filesystem::path& directory);

/// How many of `kind.ext`, `kind_1.ext`, ... `directory` holds (Accelerate numbers them without gaps).
ACCEL_DECL std::size_t count_numbered(const std::filesystem::path& directory, std::string_view kind,
                                      std::string_view extension);

/// What a load of an Accelerate checkpoint applies, read and checked.
struct accelerate_contents {
  std::vector<std::map<std::string, at::Tensor>> weights;
  std::vector<c10::IValue> optimizers;  // PyTorch's optimizer state_dicts
  std::vector<c10::IValue> schedulers;  // and scheduler state_dicts
  std::vector<std::pair<at::Generator, at::Tensor>> generator_states;
};

/// Reads an Accelerate checkpoint for one process into the registry's objects and `models`, checking every count,
/// weight name and shape, optimizer field and scheduler key before anything of the program changes.
class accelerate_reader {
 public:
  ACCEL_DECL accelerate_reader(std::filesystem::path directory, const prepared_registry& registry, int process);

  ACCEL_DECL accelerate_contents read(const std::vector<std::shared_ptr<torch::nn::Module>>& models);

 private:
  ACCEL_DECL void expect(const std::string& what, std::size_t saved, std::size_t mine) const;
  /// Objects accel cannot map onto what Accelerate wrote are refused, before anything is read.
  ACCEL_DECL void refuse_unmapped_slots() const;
  ACCEL_DECL std::pair<std::map<std::string, at::Tensor>, std::string> read_model(std::size_t i) const;
  ACCEL_DECL c10::IValue read_pickle(const std::string& name) const;
  /// The CPU generator's state from this process's `random_states_{i}.pkl` (a process without one keeps its
  /// generators, as with accel's own checkpoints written by fewer processes). Python's `random` and NumPy's states
  /// there have no counterpart in a C++ program: said once, by the main process.
  ACCEL_DECL void read_generators(accelerate_contents& contents) const;

  std::filesystem::path directory_;
  int process_;
  std::size_t optimizers_;
  std::map<std::string, std::vector<std::shared_ptr<checkpoint_slot>>> slots_;
};

/// A Mersenne Twister state that Python's `random.setstate` and NumPy's `np.random.set_state` accept (checked by
/// tests/scripts/checkpoint_accelerate.py): MT19937's 624 words, seeded as both seed it by default (5489), and the
/// position 624 (the next draw regenerates them). Accelerate's load_state sets both from random_states_{i}.pkl.
ACCEL_DECL std::vector<std::int64_t> mersenne_twister_words();

/// Each process's `random_states_{i}.pkl`, as Accelerate writes it: its CPU generator's state (the one state the
/// two share) and valid Python and NumPy states.
ACCEL_DECL c10::IValue accelerate_generator_states();

/// `value` written to `directory/name` as `torch.save` would (python_pickle.hpp).
ACCEL_DECL void write_torch_save(const c10::IValue& value, const std::filesystem::path& directory,
                                 const std::string& name);

/// Writes the checkpoint of `models` and the registry's objects that Accelerate's `load_state` reads, into
/// `directory`: the main process (`process` 0) the models, optimizers and schedulers; every process its
/// `random_states_{process}.pkl`. What has no PyTorch counterpart is refused before anything is written.
ACCEL_DECL void write_accelerate_checkpoint(const std::filesystem::path& directory, const prepared_registry& registry,
                                            const std::vector<std::shared_ptr<torch::nn::Module>>& models, int process,
                                            bool safe_serialization);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/accelerate_format.ipp"
#endif
