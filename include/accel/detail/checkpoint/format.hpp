/// \file
/// The names of a checkpoint's files (docs/checkpoint-format.md), written once: what save_state writes, what
/// load_state and merge_weights read, and what a save may remove from a directory all come from here.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "../config.hpp"

namespace accel::detail::checkpoint_files {

/// How many objects of each kind the checkpoint holds, and how many processes wrote it.
inline constexpr std::string_view accel_state = "accel_state.bin";
/// Each file's size and CRC-32C (manifest.hpp): written last, read first.
inline constexpr std::string_view manifest = "accel_checksums.txt";
/// The sharded format's table of every model tensor's full shape (sharded_format.hpp).
inline constexpr std::string_view shard_layout = "shard_layout.bin";

/// The kinds of objects a checkpoint numbers: each kind's files are `{kind}{_i}{extension}`, as Accelerate names
/// models (`model.safetensors`, `model_1.safetensors`, ...). A slot's kind (slot.hpp) is one of these names too.
namespace kind {
inline constexpr std::string_view model = "model";
inline constexpr std::string_view pickled_model = "pytorch_model";  // a model without safe_serialization
inline constexpr std::string_view optimizer = "optimizer";
inline constexpr std::string_view scheduler = "scheduler";
inline constexpr std::string_view custom_checkpoint = "custom_checkpoint";  // register_for_checkpointing
inline constexpr std::string_view range = "range";  // a prepared range's position: a key, in each process's file
inline constexpr std::string_view random_states = "random_states";  // each process's file, numbered by process
}  // namespace kind

/// The numbered files of a full checkpoint: a kind and its extension.
struct numbered_file {
  std::string_view kind;
  std::string_view extension;
};
inline constexpr numbered_file numbered_files[] = {{kind::model, ".safetensors"},
                                                   {kind::pickled_model, ".bin"},
                                                   {kind::optimizer, ".bin"},
                                                   {kind::scheduler, ".bin"},
                                                   {kind::custom_checkpoint, ".bin"}};
/// The kinds whose objects the sharded format splits into one file per process.
inline constexpr std::string_view sharded_kinds[] = {kind::model, kind::optimizer};
inline constexpr std::string_view shard_extension = ".safetensors";

/// `model.safetensors`, `model_1.safetensors`, ...: the i-th object of `kind`.
ACCEL_DECL std::string numbered(std::string_view kind, std::size_t i, std::string_view extension);
/// The full format's i-th model file: `model_{i}.safetensors`, or without `safe_serialization` Accelerate's
/// `pytorch_model_{i}.bin` (a pickled dict of tensors).
ACCEL_DECL std::string model(std::size_t i, bool safe_serialization);
inline std::string optimizer(std::size_t i) { return numbered(kind::optimizer, i, ".bin"); }
/// A shared slot's file: `scheduler.bin`, `custom_checkpoint_1.bin`, ...
inline std::string slot(std::string_view kind, std::size_t i) { return numbered(kind, i, ".bin"); }
/// A per-process slot's key in its process's file: `range_0`, ...
inline std::string slot_key(std::string_view kind, std::size_t i) {
  return std::string(kind).append("_").append(std::to_string(i));
}
/// Each process's own file: `random_states_{process}.bin`.
ACCEL_DECL std::string process(int process_index);
/// A sharded checkpoint's file of one process's slices: `model_shard_3.safetensors`, `optimizer_1_shard_0.safetensors`.
ACCEL_DECL std::string shard(std::string_view kind, std::size_t i, int process_index);

/// `text` is `prefix` followed by decimal digits only.
ACCEL_DECL bool is_numbered(std::string_view text, std::string_view prefix);
/// `stem` is `kind` or `kind_i`.
inline bool is_kind_numbered(std::string_view stem, std::string_view kind) {
  return stem == kind || is_numbered(stem, std::string(kind) + "_");
}

/// A name save_state writes, or one of its temporary files (`NAME.tmpPID`).
ACCEL_DECL bool is_checkpoint_file(std::string_view name);

}  // namespace accel::detail::checkpoint_files

#if ACCEL_HEADER_ONLY
#include "impl/format.ipp"
#endif
