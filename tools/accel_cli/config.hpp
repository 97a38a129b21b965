// `accel config`: writes the config file that `accel launch` and accel::read_run_config() read.
#pragma once

#include <string>
#include <vector>

#include "command.hpp"

namespace accel::cli {

int config_main(const std::vector<std::string>& args);

inline constexpr command config_command{
    "config", "write the config file that 'accel launch' and accel::dispatch read (precision, accumulation, processes)",
    "accel config [--config_file F] [--mixed_precision no|bf16|fp16|fp8] [--gradient_accumulation_steps N] "
    "[--num_processes N] [--num_machines K] [--machine_rank I] [--main_process_ip A] [--main_process_port P] "
    "[--parallelism_config_{dp_replicate,dp_shard,cp,tp}_size N]",
    config_main};

}  // namespace accel::cli
