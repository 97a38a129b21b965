// What accel::dispatch costs: the same training loop run on an accelerator<> built directly and on one chosen at
// run time by accel::dispatch among three compiled configurations (the fitting one listed last, so that dispatch
// tries the others first). dispatch calls the loop once with the concrete type, so the loop itself is compiled per
// configuration with no dispatch inside; what remains is the choice at start-up. Tiny MLP (width 64), AdamW,
// batch 64, one thread: where any per-step cost would show most. Each round runs both, in reverse order every other
// round; the figure is the median over rounds of dispatched time / direct time, both timed from before the
// accelerator is built to the end of the loop.
//
// Run: scripts/bench.sh dispatch   (target ratio <= 1.01)
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
using bench::seconds_since;

/// The user's loop, written once for any accelerator.
template <class Accelerator>
void train(Accelerator& acc, const std::vector<batch>& data, int steps) {
  auto net = bench::tiny_mlp();
  torch::optim::AdamW optimizer(net->parameters(), 1e-3);
  auto [model, opt, batches] = acc.prepare(net, optimizer, data);
  for (int done = 0; done < steps;) {
    for (auto&& [x, y] : batches) {
      auto loss = torch::mse_loss(model(x), y);
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
      if (++done == steps) break;
    }
  }
}

const accel::options cpu{.cpu = true};

/// Seconds per step with the accelerator's type written in the program.
double direct(const std::vector<batch>& data, int steps) {
  const auto start = clock_type::now();
  accel::accelerator<> acc(cpu);
  train(acc, data, steps);
  return seconds_since(start) / steps;
}

using compiled =
    accel::configs<accel::accelerator<accel::bf16>,
                   accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<4>>, accel::accelerator<>>;

/// Seconds per step with the accelerator chosen by dispatch from a run configuration (fp32, no accumulation).
double dispatched(const std::vector<batch>& data, int steps) {
  const auto start = clock_type::now();
  accel::dispatch<compiled>(accel::run_config{}, [&](auto& acc) { train(acc, data, steps); }, cpu);
  return seconds_since(start) / steps;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 21;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 3000;
  torch::set_num_threads(1);
  const auto data = bench::tiny_batches();

  direct(data, steps / 4);  // warm-up: allocator, kernels, page faults
  dispatched(data, steps / 4);
  std::vector<double> typed, chosen, ratios;
  for (int r = 0; r < rounds; ++r) {
    const bool dispatch_first = r % 2 == 1;
    const double first = dispatch_first ? dispatched(data, steps) : direct(data, steps);
    const double second = dispatch_first ? direct(data, steps) : dispatched(data, steps);
    typed.push_back(dispatch_first ? second : first);
    chosen.push_back(dispatch_first ? first : second);
    ratios.push_back(chosen.back() / typed.back());
  }
  std::printf(
      "dispatch vs a directly typed accelerator (tiny MLP width %d, AdamW, batch %d, 1 thread), "
      "%d rounds x %d steps\n",
      bench::tiny_width, bench::tiny_batch_size, rounds, steps);
  std::printf("%-44s %12s %12s\n", "loop", "median us", "min us");
  bench::print_row("accel::accelerator<> written in the program", typed);
  bench::print_row("accel::dispatch among 3 compiled configs", chosen);
  const double ratio = bench::median(ratios);
  std::printf("ratio dispatched / direct, median of per-round ratios: %.4f  [target <= 1.01: %s]\n", ratio,
              ratio <= 1.01 ? "met" : "NOT met");
}
