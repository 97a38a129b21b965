/// \file
/// Model weights on disk in the safetensors format, with the parameter and buffer names of the module (the names
/// a Python `state_dict` of the same architecture has): `accel::save_model(module, dir, max_shard_bytes)` writes
/// `model.safetensors`, or shards plus `model.safetensors.index.json` when the weights exceed the limit (as
/// Accelerate's `save_model`), and `accel::load_model(module, dir)` reads either, checking every name, shape and
/// dtype before it changes anything. The rest of a training state goes through `save_state` (checkpoint.hpp).
#pragma once

#include <ATen/core/Dict.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint_error.hpp"
#include "detail/support/atomic_file.hpp"
#include "detail/support/directory_entries.hpp"
#include "detail/support/json.hpp"
#include "detail/support/text.hpp"
#include "safetensors.hpp"

namespace accel {
namespace detail {

/// Parameters then buffers, by their dotted names.
inline safetensors::tensor_list state_of(const torch::nn::Module& module) {
  safetensors::tensor_list state;
  for (const auto& item : module.named_parameters()) state.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers()) state.emplace_back(item.key(), item.value());
  return state;
}

/// Throws `checkpoint_error` ("`what`; nothing was loaded:" and one line per problem) unless `weights` holds
/// exactly the tensors of `state` (a model's `state_of`), each with its shape and dtype.
inline void check_weights_fit(const safetensors::tensor_list& state, const std::map<std::string, at::Tensor>& weights,
                              const std::string& what) {
  std::string problems;
  for (const auto& [name, tensor] : state) {
    auto found = weights.find(name);
    if (found == weights.end()) {
      problems += "\n  missing: " + name;
    } else if (found->second.sizes() != tensor.sizes() || found->second.scalar_type() != tensor.scalar_type()) {
      std::ostringstream mismatch;
      mismatch << "\n  " << name << ": the file has " << found->second.scalar_type() << found->second.sizes()
               << ", the model " << tensor.scalar_type() << tensor.sizes();
      problems += mismatch.str();
    }
  }
  for (const auto& [name, tensor] : weights)
    if (std::none_of(state.begin(), state.end(), [&](const auto& s) { return s.first == name; }))
      problems += "\n  unexpected: " + name;
  if (!problems.empty()) throw checkpoint_error(what + "; nothing was loaded:" + problems);
}
/// The same against `module`'s parameters and buffers.
inline void check_weights_fit(const torch::nn::Module& module, const std::map<std::string, at::Tensor>& weights,
                              const std::string& what) {
  check_weights_fit(state_of(module), weights, what);
}

/// Copies `weights` (checked by `check_weights_fit`) into `module`'s parameters and buffers, in place.
inline void copy_weights(torch::nn::Module& module, const std::map<std::string, at::Tensor>& weights) {
  at::NoGradGuard no_grad;
  for (auto& [name, tensor] : state_of(module)) tensor.copy_(weights.at(name));
}

inline std::string shard_name(std::size_t index, std::size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

/// The weight map of `model.safetensors.index.json` (only the part this library writes and reads).
inline std::map<std::string, std::string> read_weight_map(const std::filesystem::path& index) {
  const auto text = safetensors::detail::read_file(index);
  const auto map_start = text.find("\"weight_map\"");
  if (map_start == std::string::npos)
    throw checkpoint_error("accel: " + index.string() + " has no \"weight_map\": not a safetensors index");
  std::map<std::string, std::string> map;
  auto pos = text.find('{', map_start);
  const auto end = text.find('}', pos);
  while (pos != std::string::npos && pos < end) {
    const auto k1 = text.find('"', pos + 1);
    if (k1 == std::string::npos || k1 > end) break;
    const auto k2 = text.find('"', k1 + 1);
    const auto v1 = text.find('"', k2 + 1);
    const auto v2 = text.find('"', v1 + 1);
    if (k2 == std::string::npos || v1 == std::string::npos || v2 == std::string::npos || v2 > end)
      throw checkpoint_error("accel: " + index.string() + " is corrupt: its weight map cannot be read");
    map[text.substr(k1 + 1, k2 - k1 - 1)] = text.substr(v1 + 1, v2 - v1 - 1);
    pos = v2 + 1;
  }
  return map;
}

}  // namespace detail

namespace detail {
/// (name, tensor) items of a `std::map`, a vector of pairs (`get_state_dict`'s) or a LibTorch `OrderedDict`
/// (`named_parameters()`), in their order.
template <class Named>
safetensors::tensor_list named_tensors(const Named& named) {
  safetensors::tensor_list list;
  for (const auto& item : named) {
    if constexpr (requires {
                    item.key();
                    item.value();
                  })
      list.emplace_back(item.key(), item.value());
    else
      list.emplace_back(item.first, item.second);
  }
  return list;
}

/// `tensors` written to `path` atomically: safetensors, or a pickled dict of CPU tensors (`unpickle_tensors`
/// here; Python's `torch.load(path, weights_only=False)`). Returns the file's size and checksum.
inline written_file save_tensors(const safetensors::tensor_list& tensors, const std::filesystem::path& path,
                                 bool safe_serialization) {
  if (safe_serialization) return safetensors::save(path, tensors);
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor.detach().to(at::kCPU));
  const auto bytes = torch::jit::pickle_save(c10::IValue(dict));
  return write_atomically<checkpoint_error>(path, [&](auto& out) { out.write(bytes.data(), bytes.size()); });
}

/// The named tensors of a pickled dict that `save_tensors` wrote (in its order), from the bytes of `file`.
inline safetensors::tensor_list unpickle_tensors(const std::string& bytes, const std::string& file) {
  const auto refuse = [&file](const std::string& why) {
    return checkpoint_error(file + " is not a pickled dict of named tensors (" + why + ")");
  };
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    throw refuse(first_line(e.what()));
  }
  if (!value.isGenericDict()) throw refuse("it holds a " + value.tagKind());
  safetensors::tensor_list tensors;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) throw refuse("an entry is not a string and a tensor");
    tensors.emplace_back(entry.key().toStringRef(), entry.value().toTensor());
  }
  return tensors;
}
}  // namespace detail

/// Writes `module`'s parameters and buffers to `directory` (created if needed): `model.safetensors`, or, when
/// they exceed `max_shard_bytes`, `model-0000k-of-0000n.safetensors` files plus `model.safetensors.index.json`.
/// Model files left there by an earlier save are removed first.
inline void save_model(const torch::nn::Module& module, const std::filesystem::path& directory,
                       std::int64_t max_shard_bytes = 10'000'000'000) {
  std::filesystem::create_directories(directory);
  for (const auto& file : detail::directory_entries(directory)) {
    const auto name = file.path().filename().string();
    if (name.rfind("model", 0) == 0 && (name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json")))
      std::filesystem::remove(file.path());
  }
  std::vector<safetensors::tensor_list> shards(1);
  std::int64_t shard_bytes = 0, total = 0;
  for (auto& [name, tensor] : detail::state_of(module)) {
    const auto bytes = static_cast<std::int64_t>(tensor.nbytes());
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(name, tensor);
    shard_bytes += bytes;
    total += bytes;
  }
  if (shards.size() == 1) return void(safetensors::save(directory / "model.safetensors", shards.front()));
  std::ostringstream index;
  index << "{\"metadata\": {\"total_size\": " << total << "}, \"weight_map\": {";
  const char* separator = "";
  for (std::size_t i = 0; i < shards.size(); ++i) {
    safetensors::save(directory / detail::shard_name(i, shards.size()), shards[i]);
    for (const auto& [name, tensor] : shards[i]) {
      index << separator << detail::json_string(name) << ": \"" << detail::shard_name(i, shards.size()) << "\"";
      separator = ", ";
    }
  }
  index << "}}\n";
  detail::write_atomically<checkpoint_error>(directory / "model.safetensors.index.json",
                                             [&](auto& out) { out.write(index.str()); });
}

/// Loads what `save_model` wrote (or a Python `save_file(state_dict)`) into `module`: a directory holding
/// `model.safetensors` or an index with its shards, or a `.safetensors` file. Every parameter and buffer must be
/// there with its shape and dtype, and nothing else; otherwise it throws `accel::checkpoint_error` listing the
/// differences, and `module` is left as it was.
inline void load_model(torch::nn::Module& module, const std::filesystem::path& where) {
  safetensors::tensor_list loaded;
  if (std::filesystem::is_directory(where)) {
    const auto index = where / "model.safetensors.index.json";
    if (std::filesystem::exists(index)) {
      std::set<std::string> files;
      for (const auto& [name, file] : detail::read_weight_map(index)) files.insert(file);
      for (const auto& file : files)
        for (auto& entry : safetensors::load(where / file)) loaded.push_back(std::move(entry));
    } else {
      loaded = safetensors::load(where / "model.safetensors");
    }
  } else {
    loaded = safetensors::load(where);
  }
  const std::map<std::string, at::Tensor> by_name(loaded.begin(), loaded.end());
  detail::check_weights_fit(module, by_name, "accel: the weights in " + where.string() + " do not fit this model");
  detail::copy_weights(module, by_name);
}

}  // namespace accel
