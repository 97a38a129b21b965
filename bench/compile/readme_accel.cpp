// The README's program (its first snippet), for the compile-time benchmark (scripts/bench.sh compile):
// readme_torch.cpp is the same loop written with LibTorch alone.
#include <accel/accel.hpp>
#include <torch/torch.h>
int main() {
  torch::nn::Linear net(1, 1);
  torch::optim::SGD optimizer(net->parameters(), /*lr=*/0.1);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data(8, {torch::ones({4, 1}), 3 * torch::ones({4, 1})});
  accel::accelerator<> acc;
  auto [model, opt, batches] = acc.prepare(net, optimizer, data);
  for (auto&& [x, y] : batches) {
    auto loss = torch::mse_loss(model(x), y);
    acc.backward(loss);
    opt.step();
    opt.zero_grad();
  }
  acc.print("weight =", acc.unwrap_model(model)->weight);
}
