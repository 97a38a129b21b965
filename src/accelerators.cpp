// accel::compiled: the basic accelerator configurations, instantiated once (detail/common_configurations.hpp), which
// accelerator.hpp declares extern in separate compilation.
#include <accel/accelerator.hpp>
#include <accel/checkpoint.hpp>  // save_state's and load_state's bodies
#include <accel/detail/common_configurations.hpp>

namespace accel {
ACCEL_BASIC_CONFIGURATIONS(ACCEL_INSTANTIATE_CONFIGURATION)
}  // namespace accel
