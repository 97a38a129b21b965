// expect-error: accelerator's 3rd argument must be an accumulation policy
#include <accel/accel.hpp>
accel::accelerator<accel::fp32, accel::single_process, accel::bf16> acc;
