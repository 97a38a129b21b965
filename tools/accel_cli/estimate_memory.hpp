// `accel estimate-memory MODEL` (Accelerate's `accelerate estimate-memory`): the bytes per process of training a
// model, from its safetensors headers alone.
#pragma once

#include <string>
#include <vector>

#include "command.hpp"

namespace accel::cli {

int estimate_memory_main(const std::vector<std::string>& args);

inline constexpr command estimate_memory_command{
    "estimate-memory",
    "bytes per process to train a safetensors model under each precision, parallel policy and number of processes",
    "accel estimate-memory MODEL.safetensors|model.safetensors.index.json [--num_processes 1,2,4,8] "
    "[--optimizer adamw] [--mixed_precision no,bf16,fp16] [--bytes]",
    estimate_memory_main};

}  // namespace accel::cli
