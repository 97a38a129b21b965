// expect-error: accelerator's 2nd argument must be a parallel policy
#include <accel/accel.hpp>
accel::accelerator<accel::fp32, int> acc;
