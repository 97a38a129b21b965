// Overhead of accel's training step against the raw LibTorch loop, measured side by side in one run.
// Tiny MLP (width 64), AdamW, batch 64, one thread: the setting where any per-step overhead shows most.
// Each round runs the three loops, in reverse order every other round, so that drift hits all alike; the figures
// reported are medians over rounds of accel's time divided by a baseline's time in the same round.
//
// Run: scripts/bench.sh   (prints a table; target ratio <= 1.02)
#include <accel/accel.hpp>
#include <torch/torch.h>

#include "support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

namespace {

using bench::batch;
using bench::clock_type;

/// How the hand-written loop clears gradients: LibTorch 1.13's `zero_grad()` zeroes them in place; setting them
/// to none is what accel (like Accelerate) does, so that baseline isolates accel's own overhead.
enum class clear_grads { zero, set_to_none };

/// Seconds per step of the hand-written loop.
double raw_loop(const std::vector<batch>& data, int steps, clear_grads clear) {
  auto net = bench::tiny_mlp();
  torch::optim::AdamW optimizer(net->parameters(), 1e-3);
  const auto start = clock_type::now();
  for (int done = 0; done < steps;) {
    for (const auto& [x, y] : data) {
      auto loss = torch::mse_loss(net->forward(x), y);
      loss.backward();
      optimizer.step();
      if (clear == clear_grads::zero)
        optimizer.zero_grad();
      else
        for (auto& group : optimizer.param_groups())
          for (auto& p : group.params()) p.mutable_grad().reset();
      if (++done == steps) break;
    }
  }
  return bench::seconds_since(start) / steps;
}

/// Seconds per step of the same loop through accel::accelerator<>.
double accel_loop(const std::vector<batch>& data, int steps) {
  auto net = bench::tiny_mlp();
  torch::optim::AdamW optimizer(net->parameters(), 1e-3);
  accel::accelerator<> acc{{.cpu = true}};
  auto [model, opt, batches] = acc.prepare(net, optimizer, data);
  const auto start = clock_type::now();
  for (int done = 0; done < steps;) {
    for (auto&& [x, y] : batches) {
      auto loss = torch::mse_loss(model(x), y);
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
      if (++done == steps) break;
    }
  }
  return bench::seconds_since(start) / steps;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 21;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 3000;
  torch::set_num_threads(1);
  const auto data = bench::tiny_batches();

  raw_loop(data, steps / 4, clear_grads::zero);  // warm-up: allocator, kernels, page faults
  accel_loop(data, steps / 4);

  std::vector<double> raw, raw_none, accelerated, ratios, ratios_none;
  for (int r = 0; r < rounds; ++r) {
    double t_raw, t_none, t_accel;
    if (r % 2 == 0) {
      t_raw = raw_loop(data, steps, clear_grads::zero);
      t_none = raw_loop(data, steps, clear_grads::set_to_none);
      t_accel = accel_loop(data, steps);
    } else {
      t_accel = accel_loop(data, steps);
      t_none = raw_loop(data, steps, clear_grads::set_to_none);
      t_raw = raw_loop(data, steps, clear_grads::zero);
    }
    raw.push_back(t_raw);
    raw_none.push_back(t_none);
    accelerated.push_back(t_accel);
    ratios.push_back(t_accel / t_raw);
    ratios_none.push_back(t_accel / t_none);
  }

  std::printf("tiny MLP step (width %d, AdamW, batch %d, 1 thread), %d rounds x %d steps\n", bench::tiny_width,
              bench::tiny_batch_size, rounds, steps);
  std::printf("%-44s %12s %12s\n", "loop", "median us", "min us");
  bench::print_row("raw LibTorch (zero_grad)", raw);
  bench::print_row("raw LibTorch (grads set to none)", raw_none);
  bench::print_row("accel::accelerator<>", accelerated);
  const double ratio = bench::median(ratios);
  std::printf("ratio accel / raw (zero_grad), median of per-round ratios:   %.4f  [target <= 1.02: %s]\n", ratio,
              ratio <= 1.02 ? "met" : "NOT met");
  std::printf("ratio accel / raw (set to none), median of per-round ratios: %.4f  (accel's own overhead)\n",
              bench::median(ratios_none));
}
