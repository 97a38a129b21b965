/// \file
/// What data_loader.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../data_loader.hpp"

namespace accel::detail {

std::string failure_text(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    return first_line(e.what());
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

}  // namespace accel::detail
