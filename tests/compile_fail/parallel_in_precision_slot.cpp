// expect-error: accelerator's 1st argument must be a precision policy
#include <accel/accel.hpp>
accel::accelerator<accel::single_process> acc;
