/// \file
/// What settings.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../settings.hpp"

namespace accel::detail {

checkpoint_settings::checkpoint_settings(const project_options& options)
    : project(options), next_number(options.iteration) {
  if (next_number) check_checkpoint_number(*next_number, "accel::options: project.iteration");
}

void checkpoint_settings::check_checkpoint_number(std::int64_t number, const std::string& what) {
  if (number < 0 || number == std::numeric_limits<std::int64_t>::max())
    throw std::invalid_argument(what + " = " + std::to_string(number) +
                                " is not a checkpoint number: give 0 or more (below the largest int64)");
}

}  // namespace accel::detail
