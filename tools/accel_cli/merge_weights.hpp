// `accel merge-weights [flags] CHECKPOINT OUT`: the full weights of a checkpoint, written as model.safetensors.
#pragma once

#include <string>
#include <vector>

#include "command.hpp"

namespace accel::cli {

int merge_weights_main(const std::vector<std::string>& args);

inline constexpr command merge_weights_command{
    "merge-weights",
    "write a checkpoint's full weights (a sharded one's assembled from every process's files) as model.safetensors",
    "accel merge-weights [--unsafe_serialization] [--remove_checkpoint_dir] CHECKPOINT OUT", merge_weights_main};

}  // namespace accel::cli
