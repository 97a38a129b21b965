// expect-error: data_parallel<Backend> takes accel::gloo \(CPU\) or accel::nccl \(CUDA\)
#include <accel/accel.hpp>
accel::accelerator<accel::fp32, accel::data_parallel<int>> acc;
