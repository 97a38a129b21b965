// expect-error: accel::local_sgd averages whole parameters, each process stepping its whole model alone
#include <accel/accel.hpp>
#include <torch/nn/modules/linear.h>
void average(accel::accelerator<accel::fp32, accel::tensor_parallel<accel::gloo>>& acc, torch::nn::Linear net) {
  auto model = acc.prepare(net);
  accel::local_sgd local(acc, model, 4);  // tensor_parallel's processes hold slices of the split layers
}
