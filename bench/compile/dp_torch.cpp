// The data-parallel loop of dp_accel.cpp written with LibTorch alone: c10d's Gloo process group over a TCPStore
// (torchrun's variables), process 0's weights broadcast, each process's share of the batches, bf16 autocast, the
// gradients all-reduced and averaged before each step.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace {
int variable(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::stoi(value) : fallback;
}
}  // namespace

int main() {
  const int rank = variable("RANK", 0);
  const int world = variable("WORLD_SIZE", 1);
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(variable("MASTER_PORT", 29500));
  store_options.isServer = rank == 0;
  store_options.numWorkers = world;
  const char* address = std::getenv("MASTER_ADDR");
  auto store = c10::make_intrusive<c10d::TCPStore>(address != nullptr ? address : "127.0.0.1", store_options);
  auto group_options = c10d::ProcessGroupGloo::Options::create();
  group_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, group_options);

  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
  for (auto& parameter : net->parameters()) {
    std::vector<torch::Tensor> tensors{parameter.data()};
    group->broadcast(tensors)->wait();
  }
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  for (int i = 0; i < 16; ++i) data.emplace_back(torch::randn({8, 16}), torch::randn({8, 1}));

  for (int epoch = 0; epoch < 2; ++epoch) {
    for (std::size_t i = static_cast<std::size_t>(rank); i < data.size(); i += static_cast<std::size_t>(world)) {
      const auto& [x, y] = data[i];
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      auto loss = torch::mse_loss(net->forward(x).to(torch::kFloat), y);
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
      loss.backward();
      for (auto& parameter : net->parameters()) {
        std::vector<torch::Tensor> tensors{parameter.grad()};
        group->allreduce(tensors)->wait();
        parameter.grad().div_(world);
      }
      optimizer.step();
      optimizer.zero_grad();
    }
  }
  if (rank == 0) std::cout << "weight sum = " << net->parameters()[0].sum().item<double>() << std::endl;
}
