/// \file
/// The sharded accelerator configurations on Gloo that accel::compiled instantiates (common_configurations.hpp),
/// declared `extern template` in separate compilation: accel.hpp includes this header, and so may a file that
/// includes the sharded policies' headers without accel.hpp.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include "../accelerator.hpp"
#include "../hybrid_sharded.hpp"
#include "../sharded_data_parallel.hpp"
#include "config.hpp"

#if !ACCEL_HEADER_ONLY
#include "common_configurations.hpp"
namespace accel {
ACCEL_SHARDED_CONFIGURATIONS(ACCEL_EXTERN_CONFIGURATION)
}  // namespace accel
#endif
