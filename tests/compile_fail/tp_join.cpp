// expect-error: join_uneven_inputs needs a parallel policy that joins uneven inputs
#include <accel/accel.hpp>
#include <torch/nn/modules/linear.h>
// tensor_parallel declares no joins_uneven_inputs: a process out of data would leave its tp peers' all-reduces alone.
void train(accel::accelerator<accel::fp32, accel::tensor_parallel<accel::gloo>>& acc, torch::nn::Linear net) {
  auto model = acc.prepare(net);
  auto join = acc.join_uneven_inputs(model);
}
