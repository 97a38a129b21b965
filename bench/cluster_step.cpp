// One accel job of the cluster benchmark (bench/cluster_links.py runs it on 2 machines x 2 processes of the namespace
// cluster, one `accel launch` per machine): the MLP of bench/cluster_step.py (4 hidden Linear layers of WIDTH with
// ReLU, then 8 outputs: every tensor's size a multiple of 8, so that no collective pads or rounds), AdamW, batch 32
// per process, one thread per process, over Gloo. Policies: data_parallel, zero2, fully_sharded, hybrid_sharded
// (launched with dp_replicate 2 x dp_shard 2: shards within a machine, replicas across). Process 0 prints
//   `policy width steps ms_per_step`
// where ms_per_step is timed over STEPS steps after WARMUP untimed ones, every process starting and ending together.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "support.hpp"

namespace {

torch::nn::Sequential cluster_mlp(int width) {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < 4; ++i) {
    net->push_back(torch::nn::Linear(width, width));
    net->push_back(torch::nn::ReLU());
  }
  net->push_back(torch::nn::Linear(width, 8));
  return net;
}

template <class Parallel>
int run(const std::string& policy, int width, int steps, int warmup) {
  accel::accelerator<accel::fp32, Parallel> acc;
  auto net = cluster_mlp(width);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(net, optimizer);
  torch::manual_seed(1 + acc.process_index());
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  for (int i = 0; i < 8; ++i) data.emplace_back(torch::randn({32, width}), torch::randn({32, 8}));
  const auto step = [&](int i) {
    const auto& [x, y] = data[static_cast<std::size_t>(i) % data.size()];
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  };
  const double ms = bench::seconds_per_step(acc, step, steps, warmup) * 1e3;
  if (acc.is_main_process()) std::printf("%s %d %d %.4f\n", policy.c_str(), width, steps, ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s data_parallel|zero2|fully_sharded|hybrid_sharded WIDTH STEPS WARMUP\n", argv[0]);
    return 2;
  }
  const std::string policy = argv[1];
  const int width = std::atoi(argv[2]), steps = std::atoi(argv[3]), warmup = std::atoi(argv[4]);
  torch::set_num_threads(1);
  if (policy == "zero2") return run<accel::zero2<accel::gloo>>(policy, width, steps, warmup);
  if (policy == "fully_sharded") return run<accel::fully_sharded<accel::gloo>>(policy, width, steps, warmup);
  if (policy == "hybrid_sharded") return run<accel::hybrid_sharded<accel::gloo>>(policy, width, steps, warmup);
  if (policy == "data_parallel") return run<accel::data_parallel<accel::gloo>>(policy, width, steps, warmup);
  std::fprintf(stderr, "%s: unknown policy '%s'\n", argv[0], policy.c_str());
  return 2;
}
