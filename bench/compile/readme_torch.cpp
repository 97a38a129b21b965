// The README's loop (readme_accel.cpp) written with LibTorch alone: the compile-time benchmark's peer.
#include <torch/torch.h>
#include <iostream>
int main() {
  torch::nn::Linear net(1, 1);
  torch::optim::SGD optimizer(net->parameters(), /*lr=*/0.1);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data(8, {torch::ones({4, 1}), 3 * torch::ones({4, 1})});
  torch::Device device(torch::kCPU);
  net->to(device);
  for (auto&& [x, y] : data) {
    auto loss = torch::mse_loss(net(x.to(device)), y.to(device));
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
  }
  std::cout << "weight = " << net->weight << std::endl;
}
