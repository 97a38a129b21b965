// The canonical first Accelerate program, with accel: learn y = 3x from 1000 noisy samples with SGD and MSE.
// Build and run: scripts/example.sh
#include <accel/accelerator.hpp>  // the accelerator alone: accel/accel.hpp brings every capability
#include <torch/torch.h>

#include <cstdio>
#include <utility>
#include <vector>

int main() {
  torch::manual_seed(0);

  // 1000 samples of y = 3x + noise, in shuffled mini-batches of 50.
  const auto x = torch::rand({1000, 1}) * 2 - 1;
  const auto y = 3 * x + 0.1 * torch::randn({1000, 1});
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (const auto& idx : torch::randperm(1000).split(50)) batches.emplace_back(x.index({idx}), y.index({idx}));

  torch::nn::Linear net(1, 1);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));

  accel::accelerator<> acc;  // fp32, one process (CUDA device 0 when there is one), no accumulation
  auto [model, opt, data] = acc.prepare(net, optimizer, batches);

  for (int epoch = 0; epoch < 20; ++epoch) {
    for (auto&& [inputs, targets] : data) {
      auto loss = torch::mse_loss(model(inputs), targets);
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
    }
  }

  const auto& learned = acc.unwrap_model(model);
  acc.print("weight =", learned->weight.item<double>(), "bias =", learned->bias.item<double>());
}
