// expect-error: accel::fp8's recipe is accel::tensorwise_scaling, accel::rowwise_scaling or accel::delayed_scaling
#include <accel/accel.hpp>
accel::accelerator<accel::fp8<accel::bf16>> acc;
