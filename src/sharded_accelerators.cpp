// accel::compiled: the sharded accelerator configurations on Gloo, instantiated once
// (detail/common_configurations.hpp), which detail/sharded_configurations.hpp declares extern in separate compilation.
#include <accel/detail/common_configurations.hpp>
#include <accel/detail/sharded_configurations.hpp>

namespace accel {
ACCEL_SHARDED_CONFIGURATIONS(ACCEL_INSTANTIATE_CONFIGURATION)
}  // namespace accel
