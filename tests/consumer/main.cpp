// A program outside accel's tree, built against the installed package.
#include <accel/accel.hpp>
#include <torch/torch.h>

int main() {
  torch::nn::Linear net(2, 1);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
  accel::accelerator<> acc;
  auto [model, opt] = acc.prepare(net, optimizer);
  acc.backward(model(torch::ones({4, 2})).sum());
  opt.step();
  opt.zero_grad();
  acc.print("consumer ok on", acc.device());
  return net->weight.grad().defined() ? 1 : 0;  // zero_grad sets gradients to none
}
