// expect-error: N counts micro-batches per optimizer step and must be at least 1
#include <accel/accel.hpp>
accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<0>> acc;
