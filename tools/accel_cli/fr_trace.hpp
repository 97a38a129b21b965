// `accel fr-trace DIR`: every process's flight record in DIR, matched, and a verdict naming the missing process and
// the collective, or the desynchronised one.
#pragma once

#include <string>
#include <vector>

#include "command.hpp"

namespace accel::cli {

int fr_trace_main(const std::vector<std::string>& args);

inline constexpr command fr_trace_command{
    "fr-trace", "name the process and collective a job hung on, from every process's flight record (torchfrtrace)",
    "accel fr-trace DIR", fr_trace_main};

}  // namespace accel::cli
