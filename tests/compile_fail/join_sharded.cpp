// expect-error: join_uneven_inputs needs a parallel policy that joins uneven inputs
#include <accel/accel.hpp>
#include <torch/nn/modules/linear.h>
// zero2 declares no joins_uneven_inputs: it communicates around each optimizer step.
void train(accel::accelerator<accel::fp32, accel::zero2<accel::gloo>>& acc, torch::nn::Linear net) {
  auto model = acc.prepare(net);
  auto join = acc.join_uneven_inputs(model);
}
