// `accel test`: a short data-parallel run on this machine, to check that accel works here.
#pragma once

#include <string>
#include <vector>

#include "command.hpp"

namespace accel::cli {

int test_main(const std::vector<std::string>& args);

inline constexpr command test_command{
    "test", "check that accel works on this machine: a short run of 2 Gloo processes under accel launch",
    "accel test [--nproc_per_node N]", test_main};

}  // namespace accel::cli
