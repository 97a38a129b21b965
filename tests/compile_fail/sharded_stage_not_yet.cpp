// expect-error: only shard_stage::optimizer \(accel::zero1\) is implemented so far
#include <accel/accel.hpp>
accel::accelerator<accel::fp32, accel::sharded_data_parallel<accel::gloo, accel::shard_stage::gradients>> acc;
