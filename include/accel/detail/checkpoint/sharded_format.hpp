/// \file
/// The sharded checkpoint format (`options::sharding.state_dict = accel::state_dict_type::sharded`): each process
/// writes its own slices, nothing is gathered, and any number of processes reads them back.
/// - `model_shard_{r}.safetensors` (`model_{i}_shard_{r}` for the i-th model): process r's slice (flat) of each
///   parameter its policy shards, under the parameter's name; process 0's file also holds what no policy shards
///   (frozen parameters, buffers, everything under data_parallel), in full.
/// - `optimizer_shard_{r}.safetensors` (`optimizer_{i}_shard_{r}`): process r's slice of each state tensor of its
///   optimizer, under `{model}.{parameter}/{field}` (`model.l1.weight/exp_avg`, `model_1.fc.bias/step`), the step
///   counts as 0-d int64 tensors; `optimizer.bin` (main process): the optimizer's groups and options, no state.
/// - `shard_layout.bin` (main process): the number of processes, and each model tensor's name, full shape and
///   whether it is sharded. Process r's slice of a sharded tensor of n elements is its elements [r c, (r + 1) c)
///   flattened, c = ceil(n / P) (shard_layout.hpp): concatenated in process order, the slices are the tensor.
/// Loading reads of these files only what each process holds (rank_local.hpp): its slices, by ranged reads of the
/// files whose slices overlap them, or whole tensors where the policy holds them whole; so a sharded checkpoint loads
/// under any number of processes and any parallel policy.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "../../collectives.hpp"
#include "../../model_weights.hpp"
#include "../../safetensors.hpp"
#include "../support/atomic_file.hpp"
#include "format.hpp"
#include "slot.hpp"
#include "manifest.hpp"
#include "../compat.hpp"
#include "../support/optimizer_state.hpp"
#include "../sharding/shard_layout.hpp"

namespace accel::detail {

/// A model's part of the layout table: each tensor (parameters, then buffers) by name, its full shape, and whether
/// its elements are spread over the processes' files.
struct model_layout {
  std::vector<std::string> names;
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<bool> sharded;

  ACCEL_DECL void write(torch::serialize::OutputArchive& archive) const;
  ACCEL_DECL static model_layout read(torch::serialize::InputArchive& archive, const std::string& where);
};

/// The layout table: the number of processes that wrote the shard files, and each model's layout.
struct shard_layout_table {
  std::int64_t processes = 0;
  std::vector<model_layout> models;

  [[nodiscard]] ACCEL_DECL written_file save(const std::filesystem::path& directory) const;
  /// The table of the checkpoint in `directory`, checked against its manifest; none for a full checkpoint.
  ACCEL_DECL static std::optional<shard_layout_table> load(const std::filesystem::path& directory,
                                                           const std::optional<checkpoint_manifest>& manifest);
};

/// A model's layout, and this process's tensors of it: the slice of each tensor `shard_of` gives, and the others
/// in full on the main process only.
template <class ShardOf>
std::pair<model_layout, safetensors::tensor_list> model_shards(const torch::nn::Module& module, ShardOf&& shard_of,
                                                               bool main) {
  model_layout layout;
  safetensors::tensor_list mine;
  for (const auto& [name, tensor] : state_of(module)) {
    const auto shard = shard_of(tensor);  // std::optional<parameter_shard>
    layout.names.push_back(name);
    layout.shapes.push_back(shard ? shard->sizes : tensor.sizes().vec());
    layout.sharded.push_back(shard.has_value());
    if (shard)
      mine.emplace_back(name, shard->slice.reshape({-1}));
    else if (main)
      mine.emplace_back(name, tensor);
  }
  return {std::move(layout), std::move(mine)};
}

/// The name a state field is saved under: `model.l1.weight/exp_avg` (`model_1.` for the second model).
ACCEL_DECL std::string state_field_name(std::size_t model, const std::string& parameter, std::string_view field);

/// This process's part of `optimizer`'s state, field by field: the slices of the parameters `shard_of` gives, and
/// the full state of the others on the main process only.
template <class ShardOf>
safetensors::tensor_list optimizer_shards_of(torch::optim::Optimizer& optimizer,
                                             const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                                             ShardOf&& shard_of, bool main) {
  safetensors::tensor_list mine;
  auto& states = optimizer.state();
  for (std::size_t m = 0; m < models.size(); ++m)
    for (const auto& item : models[m]->named_parameters()) {
      const auto shard = shard_of(item.value());
      const auto found = states.find(compat::optimizer_state_key(shard ? shard->slice : item.value()));
      if (found == states.end() || (!shard && !main)) continue;
      const bool known = visit_state(
          *found->second,
          [&](std::string_view field, at::Tensor& tensor) {
            if (tensor.defined())
              mine.emplace_back(state_field_name(m, item.key(), field), shard ? tensor.reshape({-1}) : tensor);
          },
          [&](std::string_view field, std::int64_t& count) {
            mine.emplace_back(state_field_name(m, item.key(), field), at::scalar_tensor(count, at::kLong));
          });
      if (!known)
        throw checkpoint_error(
            "accel::save_state: a sharded checkpoint holds the state of LibTorch's elementwise optimizers (Adam, "
            "AdamW, SGD, RMSprop, Adagrad) field by field; this optimizer's is another kind: use "
            "state_dict_type::full");
    }
  return mine;
}

/// Writes `optimizer`'s groups and options without its state (a sharded checkpoint's `optimizer.bin`).
template <class Save>
void without_state(torch::optim::Optimizer& optimizer, Save&& save) {
  auto kept = std::move(optimizer.state());
  optimizer.state().clear();
  try {
    std::forward<Save>(save)();
  } catch (...) {
    optimizer.state() = std::move(kept);
    throw;
  }
  optimizer.state() = std::move(kept);
}

/// The header of the checkpoint file `name` (checked: check_checkpoint_file), read through the files the manifest
/// opened: its first 8 + length bytes, none of its data.
ACCEL_DECL safetensors::detail::file_header read_checkpoint_header(const std::filesystem::path& directory,
                                                                   const std::string& name,
                                                                   const checkpoint_manifest& manifest);

/// A safetensors file of a checkpoint opened for ranged reads: its name, where its data begins, each tensor's entry
/// (and their order in the file).
struct ranged_file {
  std::string name;
  std::uint64_t data_begin = 0;
  std::vector<std::string> order;
  std::map<std::string, safetensors::detail::header_parser::entry> entries;

  /// Reads tensor `tensor`'s bytes [0, bytes) into `into`, checking that it holds exactly `bytes` of `dtype`.
  ACCEL_DECL void read(const std::string& tensor, const std::string& dtype, std::int64_t bytes, void* into,
                       const std::filesystem::path& directory, const checkpoint_manifest& manifest) const;
};

/// The checkpoint file `name`, checked against the manifest (read in pieces) and its header read; none of its
/// tensors' data is read.
ACCEL_DECL ranged_file open_ranged_file(const std::filesystem::path& directory, const std::string& name,
                                        const checkpoint_manifest& manifest);

/// Every process's shard file of model `index`, opened for ranged reads.
ACCEL_DECL std::vector<ranged_file> open_model_shards(const std::filesystem::path& directory,
                                                      const checkpoint_manifest& manifest,
                                                      const shard_layout_table& table, std::size_t index);

/// How `safetensors::save` stores tensor `tensor` of `shape` in `file`'s dtype, its bytes those of the shape.
ACCEL_DECL safetensors::detail::stored_tensor stored_as_in(const ranged_file& file, const std::string& tensor,
                                                           const std::vector<std::int64_t>& shape,
                                                           const std::filesystem::path& directory);

/// Writes the weights of a full checkpoint's `model.safetensors` (model `index`) to `out` again as
/// `safetensors::save` writes them, one tensor at a time (ranged reads); false, writing nothing, when the checkpoint
/// holds them pickled instead (`pytorch_model.bin`, read whole by the caller).
ACCEL_DECL bool rewrite_full_model(const std::filesystem::path& directory, const checkpoint_manifest& manifest,
                                   std::size_t index, const std::filesystem::path& out);

/// Writes model `index`'s full weights from every process's shard file to `out`, the file `safetensors::save` of
/// `assemble_model`'s tensors writes, one tensor at a time: each tensor's slices are read (pread) into one buffer
/// of its size, written, and let go. So what it holds at once is the largest tensor, not the model.
ACCEL_DECL void write_merged_model(const std::filesystem::path& directory, const checkpoint_manifest& manifest,
                                   const shard_layout_table& table, std::size_t index,
                                   const std::filesystem::path& out);

/// Gives each tensor `optimizer` lists (a parameter, or a policy's shard of one) its state from `state`
/// (read_held_optimizer_state: shaped as that tensor), by the name `name_of` gives it; one with nothing saved gets no
/// state, as one that never had a gradient. The tensors are taken from `state`, not copied: a load holds its state
/// once.
template <class NameOf>
void set_full_state(torch::optim::Optimizer& optimizer, std::map<std::string, at::Tensor>& state, NameOf&& name_of) {
  auto& states = optimizer.state();
  for (auto& group : optimizer.param_groups())
    for (auto& parameter : group.params()) {
      const auto key = compat::optimizer_state_key(parameter);
      states.erase(key);
      const std::string prefix = name_of(parameter);
      if (prefix.empty() || state.lower_bound(prefix) == state.end() ||
          state.lower_bound(prefix)->first.rfind(prefix, 0) != 0)
        continue;
      auto fresh = empty_state_of(optimizer);
      if (!fresh)
        throw checkpoint_error(
            "accel::load_state: a sharded checkpoint holds the state of LibTorch's elementwise optimizers (Adam, "
            "AdamW, SGD, RMSprop, Adagrad); this optimizer is another kind");
      visit_state(
          *fresh,
          [&](std::string_view field, at::Tensor& tensor) {
            if (const auto found = state.find(prefix + std::string(field)); found != state.end()) {
              if (found->second.sizes() != parameter.sizes())
                throw checkpoint_error("accel::load_state: the saved " + found->first + " has another shape than " +
                                       "its parameter");
              tensor = std::move(found->second);
            }
          },
          [&](std::string_view field, std::int64_t& count) {
            if (const auto found = state.find(prefix + std::string(field)); found != state.end())
              count = found->second.template item<std::int64_t>();
          });
      states[key] = std::move(fresh);
    }
}

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/sharded_format.ipp"
#endif
