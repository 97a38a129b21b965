// One job of the sharded benchmark (bench/sharded_compare.py runs it under `accel launch`): the MLP of
// bench/ddp_step.cpp at the given width on 2 Gloo processes, AdamW, batch 32 per process, one thread per process.
// Strategies: data_parallel, zero1, zero2, fully_sharded (the whole model gathered at once), fully_sharded_units (each
// Linear an accel::shard_unit, resharded after forward: FSDP2's default per layer). Process 0 prints one line:
//   `strategy width ms_per_step optimizer_state_bytes_per_process sent_bytes_per_step_per_process`
// where the bytes sent are what a ring algorithm sends for what one step hands to collectives, counted on a step:
// 2 (P-1)/P of what is all-reduced (gradient buckets), (P-1)/P of what is reduce-scattered or all-gathered.
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

template <class Parallel>
int run(const std::string& strategy, int width, int steps, int warmup, bool units = false) {
  accel::accelerator<accel::fp32, Parallel> acc;
  auto net = bench::wide_mlp(width, units);
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
  // One more step, its gradient collective counted.
  const auto* reducer = acc.parallel().reducer_for(*net);
  const auto gathered = [&]() -> double {
    if constexpr (requires { acc.parallel().shards_of(optimizer); })
      return static_cast<double>(acc.parallel().shards_of(optimizer)->all_gathered_elements());
    else
      return 0.0;
  };
  const auto reduced_before = reducer->payload_elements();
  const auto gathered_before = gathered();
  step(0);
  const double P = acc.num_processes(), ring = (P - 1) / P;
  const double gradients = static_cast<double>(reducer->payload_elements() - reduced_before) * 4;
  double sent = gradients * (requires { reducer->all_reduce_count(); } ? 2 * ring : ring);
  sent += (gathered() - gathered_before) * 4 * ring;
  if (acc.is_main_process())
    std::printf("%s %d %.4f %lld %.0f\n", strategy.c_str(), width, ms,
                static_cast<long long>(bench::adamw_state_bytes(optimizer)), sent);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s data_parallel|zero1|zero2|fully_sharded|fully_sharded_units WIDTH STEPS WARMUP\n",
                 argv[0]);
    return 2;
  }
  const std::string strategy = argv[1];
  const int width = std::atoi(argv[2]), steps = std::atoi(argv[3]), warmup = std::atoi(argv[4]);
  torch::set_num_threads(1);
  if (strategy == "zero1") return run<accel::zero1<accel::gloo>>(strategy, width, steps, warmup);
  if (strategy == "zero2") return run<accel::zero2<accel::gloo>>(strategy, width, steps, warmup);
  if (strategy == "fully_sharded") return run<accel::fully_sharded<accel::gloo>>(strategy, width, steps, warmup);
  if (strategy == "fully_sharded_units")
    return run<accel::fully_sharded<accel::gloo>>(strategy, width, steps, warmup, /*units=*/true);
  return run<accel::data_parallel<accel::gloo>>(strategy, width, steps, warmup);
}
