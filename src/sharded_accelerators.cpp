// accel::compiled: the sharded accelerator configurations on Gloo, instantiated once
// (detail/common_configurations.hpp), which detail/sharded_configurations.hpp declares extern in separate compilation.
#include <accel/checkpoint.hpp>  // save_state's and load_state's bodies
#include <accel/detail/common_configurations.hpp>
#include <accel/detail/sharded_configurations.hpp>

namespace accel {
ACCEL_SHARDED_CONFIGURATIONS(ACCEL_INSTANTIATE_CONFIGURATION)
}  // namespace accel
