// A bf16 data-parallel training loop on Gloo through accel, including accel/accelerator.hpp only (the compile-time
// benchmark's "data-parallel loop"; dp_torch.cpp is the same program written with LibTorch alone).
#include <accel/accelerator.hpp>
#include <torch/torch.h>

#include <utility>
#include <vector>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  for (int i = 0; i < 16; ++i) data.emplace_back(torch::randn({8, 16}), torch::randn({8, 1}));

  accel::accelerator<accel::bf16, accel::data_parallel<accel::gloo>> acc;
  auto [model, opt, batches] = acc.prepare(net, optimizer, data);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (auto&& [x, y] : batches) {
      auto loss = torch::mse_loss(model(x), y);
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
    }
  }
  acc.print("weight sum =", acc.unwrap_model(model)->parameters()[0].sum().item<double>());
}
