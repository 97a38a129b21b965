// `accel env`: what a bug report needs to know about this machine and accel's setup.
#pragma once

#include <string>
#include <vector>

#include "command.hpp"

namespace accel::cli {

int env_main(const std::vector<std::string>& args);

inline constexpr command env_command{
    "env", "print LibTorch, CUDA, NCCL, Gloo, devices, the config file and accel's environment variables", "accel env",
    env_main};

}  // namespace accel::cli
