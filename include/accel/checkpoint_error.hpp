/// \file
/// `accel::checkpoint_error`: what saving or loading state throws when a file cannot be written or read.
#pragma once

#include <stdexcept>

namespace accel {

/// A checkpoint that cannot be written or read: names the file and what is wrong with it.
struct checkpoint_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace accel
