// Overhead of accel's training step against the raw LibTorch loop, measured side by side in one run.
// Tiny MLP (width 64), AdamW, batch 64, one thread: the setting where any per-step overhead shows most.
// Each round runs the three loops, in reverse order every other round, so that drift hits all alike; the figures
// reported are medians over rounds of accel's time divided by a baseline's time in the same round.
//
// Run: scripts/bench.sh   (prints a table; target ratio <= 1.02)
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

namespace {

constexpr int width = 64;
constexpr int batch_size = 64;

torch::nn::Sequential make_mlp() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(width, width), torch::nn::ReLU(), torch::nn::Linear(width, width),
                               torch::nn::ReLU(), torch::nn::Linear(width, 1));
}

using batch = std::pair<torch::Tensor, torch::Tensor>;
using clock_type = std::chrono::steady_clock;

/// How the hand-written loop clears gradients: LibTorch 1.13's `zero_grad()` zeroes them in place; setting them
/// to none is what accel (like Accelerate) does, so that baseline isolates accel's own overhead.
enum class clear_grads { zero, set_to_none };

/// Seconds per step of the hand-written loop.
double raw_loop(const std::vector<batch>& data, int steps, clear_grads clear) {
  auto net = make_mlp();
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
  return std::chrono::duration<double>(clock_type::now() - start).count() / steps;
}

/// Seconds per step of the same loop through accel::accelerator<>.
double accel_loop(const std::vector<batch>& data, int steps) {
  auto net = make_mlp();
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
  return std::chrono::duration<double>(clock_type::now() - start).count() / steps;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 21;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 3000;
  torch::set_num_threads(1);
  torch::manual_seed(1);
  std::vector<batch> data;
  for (int i = 0; i < 16; ++i) data.emplace_back(torch::randn({batch_size, width}), torch::randn({batch_size, 1}));

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

  std::printf("tiny MLP step (width %d, AdamW, batch %d, 1 thread), %d rounds x %d steps\n", width, batch_size, rounds,
              steps);
  auto row = [](const char* name, const std::vector<double>& t) {
    std::printf("%-40s %12.2f %12.2f\n", name, median(t) * 1e6, *std::min_element(t.begin(), t.end()) * 1e6);
  };
  std::printf("%-40s %12s %12s\n", "loop", "median us", "min us");
  row("raw LibTorch (zero_grad)", raw);
  row("raw LibTorch (grads set to none)", raw_none);
  row("accel::accelerator<>", accelerated);
  const double ratio = median(ratios);
  std::printf("ratio accel / raw (zero_grad), median of per-round ratios:   %.4f  [target <= 1.02: %s]\n", ratio,
              ratio <= 1.02 ? "met" : "NOT met");
  std::printf("ratio accel / raw (set to none), median of per-round ratios: %.4f  (accel's own overhead)\n",
              median(ratios_none));
}
