// Gradient accumulation on 2 Gloo processes (run by scripts/bench.sh under `accel launch`): an MLP of width 1024
// (4.2 M parameters, 2 gradient buckets), SGD, batch 32 per process, one thread per process. Three loops, each
// round in rotating order:
//   accumulate<4>                  gradients all-reduced once per optimizer step (no_sync on micro-steps)
//   accumulate<4>, sync_each_batch all-reduced on every micro-batch (the optimizer still steps every 4)
//   no accumulation                all-reduced and stepped on every micro-batch
// Process 0 prints, per loop, the all-reduces per optimizer step (counted by the reducer) and the median time per
// micro-batch, and the ratio of the first two.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include "support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using accelerator_type = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>, accel::accumulate_dynamic>;
constexpr int width = 1024;

struct result {
  double ms_per_micro_batch;
  double all_reduces_per_step;
};

result run(int steps, bool sync_each_batch, int micro_batches) {
  accelerator_type acc({.gradient_accumulation_steps = steps, .sync_each_batch = sync_each_batch});
  torch::manual_seed(0);
  auto net = torch::nn::Sequential(torch::nn::Linear(width, width), torch::nn::ReLU(), torch::nn::Linear(width, width),
                                   torch::nn::ReLU(), torch::nn::Linear(width, width), torch::nn::ReLU(),
                                   torch::nn::Linear(width, width), torch::nn::ReLU(), torch::nn::Linear(width, 1));
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  // Every process builds the same list; prepare deals its batches out between them.
  for (int i = 0; i < micro_batches * acc.num_processes(); ++i)
    data.emplace_back(torch::randn({32, width}), torch::randn({32, 1}));
  auto [model, opt, batches] = acc.prepare(net, optimizer, data);
  const auto* reducer = acc.parallel().reducer_for(*net);
  int micro_steps = 0;
  auto pass = [&] {
    int optimizer_steps = 0;
    micro_steps = 0;
    for (auto&& [x, y] : batches) {
      ++micro_steps;
      auto scope = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      opt.zero_grad();
      optimizer_steps += acc.sync_gradients();
    }
    return optimizer_steps;
  };
  pass();  // warm-up
  const auto reduces_before = reducer->all_reduce_count();
  acc.wait_for_everyone();
  const auto start = std::chrono::steady_clock::now();
  const int optimizer_steps = pass();
  acc.wait_for_everyone();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return {ms / micro_steps, double(reducer->all_reduce_count() - reduces_before) / optimizer_steps};
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const int micro_batches = argc > 2 ? std::atoi(argv[2]) : 32;
  torch::set_num_threads(1);
  struct loop {
    const char* name;
    int steps;
    bool sync_each_batch;
    std::vector<double> ms;
    double all_reduces = 0;
  };
  std::vector<loop> loops = {{"accumulate<4>", 4, false, {}},
                             {"accumulate<4>, sync_each_batch", 4, true, {}},
                             {"no accumulation", 1, false, {}}};
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> round(loops.size());
    for (std::size_t k = 0; k < loops.size(); ++k) {
      auto& l = loops[(k + r) % loops.size()];
      auto [ms, reduces] = run(l.steps, l.sync_each_batch, micro_batches);
      l.ms.push_back(ms);
      l.all_reduces = reduces;
      round[(k + r) % loops.size()] = ms;
    }
    ratios.push_back(round[0] / round[1]);
  }
  accelerator_type acc;
  if (!acc.is_main_process()) return 0;
  std::printf(
      "2 Gloo processes, MLP width %d (2 buckets), batch 32 per process, %d micro-batches per process, %d rounds\n",
      width, micro_batches, rounds);
  std::printf("%-34s %26s %22s\n", "loop", "all-reduces / optimizer step", "ms / micro-batch");
  for (const auto& l : loops) std::printf("%-34s %26.2f %22.3f\n", l.name, l.all_reduces, bench::median(l.ms));
  std::printf("time per micro-batch, accumulate<4> / sync_each_batch (median of per-round ratios): %.3f\n",
              bench::median(ratios));
}
