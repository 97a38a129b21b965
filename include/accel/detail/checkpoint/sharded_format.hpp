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

  void write(torch::serialize::OutputArchive& archive) const {
    std::vector<std::int64_t> dims, sizes, flags;
    for (std::size_t t = 0; t < names.size(); ++t) {
      dims.push_back(static_cast<std::int64_t>(shapes[t].size()));
      sizes.insert(sizes.end(), shapes[t].begin(), shapes[t].end());
      flags.push_back(sharded[t] ? 1 : 0);
    }
    archive.write("names", c10::IValue(names));
    archive.write("dims", c10::IValue(dims));
    archive.write("sizes", c10::IValue(sizes));
    archive.write("sharded", c10::IValue(flags));
  }
  static model_layout read(torch::serialize::InputArchive& archive, const std::string& where) {
    c10::IValue names, dims, sizes, flags;
    if (!archive.try_read("names", names) || !archive.try_read("dims", dims) || !archive.try_read("sizes", sizes) ||
        !archive.try_read("sharded", flags) || !names.isList() || !dims.isIntList() || !sizes.isIntList() ||
        !flags.isIntList())
      throw checkpoint_error("accel: " + where + " lacks a model's names, shapes or sharding (a damaged file?)");
    model_layout layout;
    for (const auto& name : names.toListRef()) layout.names.push_back(name.toStringRef());
    const auto dim_list = dims.toIntVector(), size_list = sizes.toIntVector(), flag_list = flags.toIntVector();
    if (dim_list.size() != layout.names.size() || flag_list.size() != layout.names.size())
      throw checkpoint_error("accel: " + where + " describes a model inconsistently (a damaged file?)");
    std::size_t next = 0;
    for (std::size_t t = 0; t < layout.names.size(); ++t) {
      if (dim_list[t] < 0 || next + static_cast<std::size_t>(dim_list[t]) > size_list.size())
        throw checkpoint_error("accel: " + where + " describes a model inconsistently (a damaged file?)");
      layout.shapes.emplace_back(size_list.begin() + static_cast<std::ptrdiff_t>(next),
                                 size_list.begin() + static_cast<std::ptrdiff_t>(next + dim_list[t]));
      next += static_cast<std::size_t>(dim_list[t]);
      layout.sharded.push_back(flag_list[t] != 0);
    }
    return layout;
  }
};

/// The layout table: the number of processes that wrote the shard files, and each model's layout.
struct shard_layout_table {
  std::int64_t processes = 0;
  std::vector<model_layout> models;

  [[nodiscard]] written_file save(const std::filesystem::path& directory) const {
    torch::serialize::OutputArchive archive;
    archive.write("format", c10::IValue(std::string("accel sharded checkpoint 1")));
    archive.write("processes", c10::IValue(processes));
    archive.write("models", c10::IValue(static_cast<std::int64_t>(models.size())));
    for (std::size_t i = 0; i < models.size(); ++i) {
      torch::serialize::OutputArchive model;
      models[i].write(model);
      archive.write("model_" + std::to_string(i), model);
    }
    const auto bytes = serialised(archive);
    return write_atomically<checkpoint_error>(directory / checkpoint_files::shard_layout,
                                              [&](auto& out) { out.write(bytes); });
  }
  /// The table of the checkpoint in `directory`, checked against its manifest; none for a full checkpoint.
  static std::optional<shard_layout_table> load(const std::filesystem::path& directory,
                                                const std::optional<checkpoint_manifest>& manifest) {
    if (!std::filesystem::exists(directory / checkpoint_files::shard_layout)) return std::nullopt;
    if (!manifest) throw sharded_without_manifest(directory);
    const auto bytes = read_checkpoint_file(directory, std::string(checkpoint_files::shard_layout), manifest);
    const auto where = (directory / checkpoint_files::shard_layout).string();
    torch::serialize::InputArchive archive;
    c10::IValue processes, models;
    try {
      archive.load_from(bytes.data(), bytes.size());
    } catch (const std::exception& e) {
      throw checkpoint_error("accel: " + where + " is truncated or corrupt: " + first_line(e.what()));
    }
    if (!archive.try_read("processes", processes) || !processes.isInt() || processes.toInt() < 1 ||
        !archive.try_read("models", models) || !models.isInt() || models.toInt() < 0)
      throw checkpoint_error("accel: " + where + " lacks the number of processes or of models (a damaged file?)");
    shard_layout_table table;
    table.processes = processes.toInt();
    for (std::int64_t i = 0; i < models.toInt(); ++i) {
      torch::serialize::InputArchive model;
      if (!archive.try_read("model_" + std::to_string(i), model))
        throw checkpoint_error("accel: " + where + " lacks model " + std::to_string(i) + "'s layout");
      table.models.push_back(model_layout::read(model, where));
    }
    return table;
  }
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
inline std::string state_field_name(std::size_t model, const std::string& parameter, std::string_view field) {
  return checkpoint_files::numbered(checkpoint_files::kind::model, model, "")
      .append(".")
      .append(parameter)
      .append("/")
      .append(field);
}

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
inline safetensors::detail::file_header read_checkpoint_header(const std::filesystem::path& directory,
                                                               const std::string& name,
                                                               const checkpoint_manifest& manifest) {
  const auto where = (directory / name).string();
  const auto size = manifest.files().at(name).size;
  std::uint64_t length = 0;
  if (size < 8 || !manifest.opened()->read_range(name, 0, sizeof length, &length))
    throw checkpoint_error("accel: " + where + " is truncated: shorter than the 8-byte header length");
  if (length > size - 8)
    throw checkpoint_error("accel: " + where + " is truncated or corrupt: its header claims " + std::to_string(length) +
                           " bytes, the file has " + std::to_string(size - 8));
  std::string text(length, '\0');
  if (!manifest.opened()->read_range(name, 8, length, text.data()))
    throw checkpoint_error("accel: cannot read the header of " + where);
  safetensors::detail::file_header header;
  safetensors::detail::header_parser(std::move(text), where).parse(header.entries, header.metadata);
  header.data_begin = 8 + length;
  return header;
}

/// A safetensors file of a checkpoint opened for ranged reads: its name, where its data begins, each tensor's entry
/// (and their order in the file).
struct ranged_file {
  std::string name;
  std::uint64_t data_begin = 0;
  std::vector<std::string> order;
  std::map<std::string, safetensors::detail::header_parser::entry> entries;

  /// Reads tensor `tensor`'s bytes [0, bytes) into `into`, checking that it holds exactly `bytes` of `dtype`.
  void read(const std::string& tensor, const std::string& dtype, std::int64_t bytes, void* into,
            const std::filesystem::path& directory, const checkpoint_manifest& manifest) const {
    const auto found = entries.find(tensor);
    if (found == entries.end())
      throw checkpoint_error("accel: " + (directory / name).string() + " lacks " + tensor + " (a damaged checkpoint?)");
    const auto& offsets = found->second.offsets;
    if (found->second.dtype != dtype || offsets.size() != 2 || offsets[1] - offsets[0] != bytes ||
        !manifest.opened()->read_range(name, data_begin + static_cast<std::uint64_t>(offsets[0]),
                                       static_cast<std::uint64_t>(bytes), into))
      throw checkpoint_error("accel: " + (directory / name).string() + " holds " + tensor +
                             " in another type or size than the layout gives (a damaged checkpoint?)");
  }
};

/// The checkpoint file `name`, checked against the manifest (read in pieces) and its header read; none of its
/// tensors' data is read.
inline ranged_file open_ranged_file(const std::filesystem::path& directory, const std::string& name,
                                    const checkpoint_manifest& manifest) {
  check_checkpoint_file(directory, name, manifest);
  auto header = read_checkpoint_header(directory, name, manifest);
  ranged_file file{.name = name, .data_begin = header.data_begin, .order = {}, .entries = {}};
  for (auto& [tensor, entry] : header.entries) {
    file.order.push_back(tensor);
    file.entries.emplace(tensor, std::move(entry));
  }
  return file;
}

/// Every process's shard file of model `index`, opened for ranged reads.
inline std::vector<ranged_file> open_model_shards(const std::filesystem::path& directory,
                                                  const checkpoint_manifest& manifest, const shard_layout_table& table,
                                                  std::size_t index) {
  std::vector<ranged_file> files;
  for (int r = 0; r < table.processes; ++r)
    files.push_back(
        open_ranged_file(directory, checkpoint_files::shard(checkpoint_files::kind::model, index, r), manifest));
  return files;
}

/// How `safetensors::save` stores tensor `tensor` of `shape` in `file`'s dtype, its bytes those of the shape.
inline safetensors::detail::stored_tensor stored_as_in(const ranged_file& file, const std::string& tensor,
                                                       const std::vector<std::int64_t>& shape,
                                                       const std::filesystem::path& directory) {
  const auto found = file.entries.find(tensor);
  const auto type =
      found == file.entries.end() ? std::nullopt : safetensors::detail::scalar_type_of(found->second.dtype);
  if (!type)
    throw checkpoint_error("accel::merge_weights: " + (directory / file.name).string() + " lacks " + tensor +
                           ", or holds it in a type accel does not read (a damaged checkpoint?)");
  return {tensor, found->second.dtype, shape,
          c10::multiply_integers(shape) * static_cast<std::int64_t>(c10::elementSize(*type))};
}

/// Writes the weights of a full checkpoint's `model.safetensors` (model `index`) to `out` again as
/// `safetensors::save` writes them, one tensor at a time (ranged reads); false, writing nothing, when the checkpoint
/// holds them pickled instead (`pytorch_model.bin`, read whole by the caller).
inline bool rewrite_full_model(const std::filesystem::path& directory, const checkpoint_manifest& manifest,
                               std::size_t index, const std::filesystem::path& out) {
  const auto name = checkpoint_files::model(index, true);
  if (!manifest.files().contains(name)) return false;
  const auto file = open_ranged_file(directory, name, manifest);
  std::vector<safetensors::detail::stored_tensor> stored;
  for (const auto& tensor : file.order)
    stored.push_back(stored_as_in(file, tensor, file.entries.at(tensor).shape, directory));
  safetensors::save_streamed(out, stored, [&](std::size_t t, auto& written) {
    auto buffer = at::empty({stored[t].bytes}, at::kByte);  // one tensor, counted by accel's CPU allocator
    file.read(stored[t].name, stored[t].dtype, stored[t].bytes, buffer.data_ptr(), directory, manifest);
    written.write(buffer.data_ptr(), static_cast<std::size_t>(stored[t].bytes));
  });
  return true;
}

/// Writes model `index`'s full weights from every process's shard file to `out`, the file `safetensors::save` of
/// `assemble_model`'s tensors writes, one tensor at a time: each tensor's slices are read (pread) into one buffer
/// of its size, written, and let go. So what it holds at once is the largest tensor, not the model.
inline void write_merged_model(const std::filesystem::path& directory, const checkpoint_manifest& manifest,
                               const shard_layout_table& table, std::size_t index, const std::filesystem::path& out) {
  const auto& layout = table.models.at(index);
  const auto files = open_model_shards(directory, manifest, table, index);
  std::vector<safetensors::detail::stored_tensor> stored;
  for (std::size_t t = 0; t < layout.names.size(); ++t)
    stored.push_back(stored_as_in(files.front(), layout.names[t], layout.shapes[t], directory));
  safetensors::save_streamed(out, stored, [&](std::size_t t, auto& file) {
    const auto element = stored[t].bytes / std::max<std::int64_t>(1, c10::multiply_integers(layout.shapes[t]));
    auto buffer = at::empty({stored[t].bytes}, at::kByte);  // counted by accel's CPU allocator, as any tensor
    auto* bytes = static_cast<char*>(buffer.data_ptr());
    if (!layout.sharded[t]) {
      files.front().read(stored[t].name, stored[t].dtype, stored[t].bytes, bytes, directory, manifest);
    } else {
      for (int r = 0; r < table.processes; ++r) {
        const auto span = shard_span_of(c10::multiply_integers(layout.shapes[t]), r, static_cast<int>(table.processes));
        files[static_cast<std::size_t>(r)].read(stored[t].name, stored[t].dtype, span.length * element,
                                                bytes + span.begin * element, directory, manifest);
      }
    }
    file.write(bytes, static_cast<std::size_t>(stored[t].bytes));
  });
}

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
