/// \file
/// What uneven_join.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../uneven_join.hpp"

namespace accel::detail {

bool join_round::anyone_training() const {
  for (bool t : training)
    if (t) return true;
  return false;
}

int join_round::last_training() const {
  for (auto r = static_cast<int>(training.size()); r-- > 0;)
    if (training[static_cast<std::size_t>(r)]) return r;
  return static_cast<int>(training.size()) - 1;
}

}  // namespace accel::detail
