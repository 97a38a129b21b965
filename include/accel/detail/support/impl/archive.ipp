/// \file
/// What archive.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../archive.hpp"

namespace accel::detail {

std::string serialised(torch::serialize::OutputArchive& archive) {
  std::ostringstream bytes;
  archive.save_to(bytes);
  return std::move(bytes).str();
}

}  // namespace accel::detail
