/// \file
/// Model weights on disk in the safetensors format, with the parameter and buffer names of the module (the names
/// a Python `state_dict` of the same architecture has): `accel::save_model(module, dir, max_shard_bytes)` writes
/// `model.safetensors`, or shards plus `model.safetensors.index.json` when the weights exceed the limit (as
/// Accelerate's `save_model`), and `accel::load_model(module, dir)` reads either, checking every name, shape and
/// dtype before it changes anything. The rest of a training state goes through `save_state` (checkpoint.hpp).
#pragma once

#include <ATen/core/Dict.h>
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

#include "detail/config.hpp"
#include "checkpoint_error.hpp"
#include "detail/support/atomic_file.hpp"
#include "detail/support/directory_entries.hpp"
#include "detail/support/json.hpp"
#include "detail/support/text.hpp"
#include "safetensors.hpp"

namespace accel {
namespace detail {

/// Parameters then buffers, by their dotted names.
ACCEL_DECL safetensors::tensor_list state_of(const torch::nn::Module& module);

/// Throws `checkpoint_error` ("`what`; nothing was loaded:" and one line per problem) unless `weights` holds
/// exactly the tensors of `state` (a model's `state_of`), each with its shape and dtype.
ACCEL_DECL void check_weights_fit(const safetensors::tensor_list& state,
                                  const std::map<std::string, at::Tensor>& weights, const std::string& what);
/// The same against `module`'s parameters and buffers.
inline void check_weights_fit(const torch::nn::Module& module, const std::map<std::string, at::Tensor>& weights,
                              const std::string& what) {
  check_weights_fit(state_of(module), weights, what);
}

/// Copies `weights` (checked by `check_weights_fit`) into `module`'s parameters and buffers, in place.
ACCEL_DECL void copy_weights(torch::nn::Module& module, const std::map<std::string, at::Tensor>& weights);

ACCEL_DECL std::string shard_name(std::size_t index, std::size_t count);

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
ACCEL_DECL written_file save_tensors(const safetensors::tensor_list& tensors, const std::filesystem::path& path,
                                     bool safe_serialization);

/// The named tensors of a pickled dict that `save_tensors` wrote (in its order), from the bytes of `file`.
ACCEL_DECL safetensors::tensor_list unpickle_tensors(const std::string& bytes, const std::string& file);
}  // namespace detail

/// Writes `module`'s parameters and buffers to `directory` (created if needed): `model.safetensors`, or, when
/// they exceed `max_shard_bytes`, `model-0000k-of-0000n.safetensors` files plus `model.safetensors.index.json`.
/// Model files left there by an earlier save are removed first.
ACCEL_DECL void save_model(const torch::nn::Module& module, const std::filesystem::path& directory,
                           std::int64_t max_shard_bytes = 10'000'000'000);

/// Loads what `save_model` wrote (or a Python `save_file(state_dict)`) into `module`: a directory holding
/// `model.safetensors` or an index with its shards, or a `.safetensors` file. Every parameter and buffer must be
/// there with its shape and dtype, and nothing else; otherwise it throws `accel::checkpoint_error` listing the
/// differences, and `module` is left as it was.
ACCEL_DECL void load_model(torch::nn::Module& module, const std::filesystem::path& where);

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/model_weights.ipp"
#endif
