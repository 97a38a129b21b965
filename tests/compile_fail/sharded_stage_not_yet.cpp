// expect-error: shard_stage::parameters \(accel::fully_sharded\) is not implemented yet
#include <accel/accel.hpp>
accel::accelerator<accel::fp32, accel::sharded_data_parallel<accel::gloo, accel::shard_stage::parameters>> acc;
