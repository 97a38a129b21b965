// expect-error: accel::local_sgd averages whole parameters: use it with data_parallel, not zero1, zero2 or fully_sharded
#include <accel/accel.hpp>
#include <torch/nn/modules/linear.h>
void average(accel::accelerator<accel::fp32, accel::zero2<accel::gloo>>& acc, torch::nn::Linear net) {
  auto model = acc.prepare(net);
  accel::local_sgd local(acc, model, 4);  // zero2 keeps slices of the gradients and optimizer state
}
