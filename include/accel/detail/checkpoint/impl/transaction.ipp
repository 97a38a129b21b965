/// \file
/// What transaction.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../transaction.hpp"

namespace accel::detail {

void load_transaction::roll_back() noexcept {
  for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) try {
      (*it)();
    } catch (...) {  // the state kept a moment ago loads; should it not, there is nothing better to do
    }
  undo_.clear();
}

}  // namespace accel::detail
