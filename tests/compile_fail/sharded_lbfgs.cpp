// expect-error: torch::optim::LBFGS cannot be sharded
#include <accel/accel.hpp>
void prepare(accel::accelerator<accel::fp32, accel::zero2<accel::gloo>>& acc, torch::nn::Linear net,
             torch::optim::LBFGS& lbfgs) {
  auto prepared = acc.prepare(net, lbfgs);
}
