// One job of the sharded benchmark (bench/sharded_compare.py runs it under `accel launch`): the MLP of
// bench/ddp_step.cpp at the given width on 2 Gloo processes, AdamW, batch 32 per process, one thread per process.
// Strategies: data_parallel, zero1. Process 0 prints one line:
//   `strategy width ms_per_step optimizer_state_bytes_per_process payload_bytes_per_step`
// where the payload is what the step hands to collectives (all-reduced gradient buckets, all-gathered shards),
// counted from the buckets the policies built.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "support.hpp"

namespace {

std::int64_t state_bytes(torch::optim::Optimizer& optimizer) {
  std::int64_t bytes = 0;
  for (auto& [key, state] : optimizer.state())
    if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state.get()))
      bytes += (adamw->exp_avg().numel() + adamw->exp_avg_sq().numel()) * 4;
  return bytes;
}

/// The gradient all-reduce payload of one synchronised backward: every bucket, its gradients and its used flags.
template <class Parallel>
std::int64_t all_reduce_bytes(const Parallel& parallel, torch::nn::Module& net) {
  const auto parameters = net.parameters();
  std::int64_t bytes = 0;
  for (const auto& bucket : parallel.reducer_for(net)->bucket_layout()) {
    for (auto i : bucket) bytes += parameters[i].numel() * 4;
    bytes += static_cast<std::int64_t>(bucket.size()) * 4;
  }
  return bytes;
}

template <class Parallel>
int run(const std::string& strategy, int width, int steps, int warmup) {
  accel::accelerator<accel::fp32, Parallel> acc;
  auto net = bench::wide_mlp(width);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(net, optimizer);
  const auto data = bench::wide_batches(width, acc.process_index());
  const auto step = [&](int i) {
    const auto& [x, y] = data[i % data.size()];
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  };
  const double ms = bench::seconds_per_step(acc, step, steps, warmup) * 1e3;
  std::int64_t payload = all_reduce_bytes(acc.parallel(), *net);
  if constexpr (requires { acc.parallel().shards_of(optimizer); }) {
    const auto* shards = acc.parallel().shards_of(optimizer);
    payload += static_cast<std::int64_t>(shards->gather_payload_elements()) * 4;
  }
  if (acc.is_main_process())
    std::printf("%s %d %.4f %lld %lld\n", strategy.c_str(), width, ms, static_cast<long long>(state_bytes(optimizer)),
                static_cast<long long>(payload));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s data_parallel|zero1 WIDTH STEPS WARMUP\n", argv[0]);
    return 2;
  }
  const std::string strategy = argv[1];
  const int width = std::atoi(argv[2]), steps = std::atoi(argv[3]), warmup = std::atoi(argv[4]);
  torch::set_num_threads(1);
  if (strategy == "zero1") return run<accel::zero1<accel::gloo>>(strategy, width, steps, warmup);
  return run<accel::data_parallel<accel::gloo>>(strategy, width, steps, warmup);
}
