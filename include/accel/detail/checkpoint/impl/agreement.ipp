/// \file
/// What agreement.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../agreement.hpp"

namespace accel::detail {

std::string first_failure(const std::vector<std::vector<char>>& reasons) {
  for (std::size_t r = 0; r < reasons.size(); ++r)
    if (!reasons[r].empty())
      return "process " + std::to_string(r) + ": " + first_line(std::string(reasons[r].begin(), reasons[r].end()));
  return "no reason given";
}

}  // namespace accel::detail
