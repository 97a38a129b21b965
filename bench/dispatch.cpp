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

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

namespace {

constexpr int width = 64;
constexpr int batch_size = 64;
using batch = std::pair<torch::Tensor, torch::Tensor>;
using clock_type = std::chrono::steady_clock;

torch::nn::Sequential make_mlp() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(width, width), torch::nn::ReLU(), torch::nn::Linear(width, width),
                               torch::nn::ReLU(), torch::nn::Linear(width, 1));
}

/// The user's loop, written once for any accelerator.
template <class Accelerator>
void train(Accelerator& acc, const std::vector<batch>& data, int steps) {
  auto net = make_mlp();
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

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

/// Seconds per step with the accelerator's type written in the program.
double direct(const std::vector<batch>& data, int steps) {
  const auto start = clock_type::now();
  accel::accelerator<> acc(cpu);
  train(acc, data, steps);
  return seconds_since(start) / steps;
}

using compiled = accel::configs<accel::accelerator<accel::bf16>,
                                accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<4>>,
                                accel::accelerator<>>;

/// Seconds per step with the accelerator chosen by dispatch from a run configuration (fp32, no accumulation).
double dispatched(const std::vector<batch>& data, int steps) {
  const auto start = clock_type::now();
  accel::dispatch<compiled>(accel::run_config{}, [&](auto& acc) { train(acc, data, steps); }, cpu);
  return seconds_since(start) / steps;
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
  std::printf("dispatch vs a directly typed accelerator (tiny MLP width %d, AdamW, batch %d, 1 thread), "
              "%d rounds x %d steps\n", width, batch_size, rounds, steps);
  std::printf("%-44s %12s %12s\n", "loop", "median us", "min us");
  auto row = [](const char* name, const std::vector<double>& t) {
    std::printf("%-44s %12.2f %12.2f\n", name, median(t) * 1e6, *std::min_element(t.begin(), t.end()) * 1e6);
  };
  row("accel::accelerator<> written in the program", typed);
  row("accel::dispatch among 3 compiled configs", chosen);
  const double ratio = median(ratios);
  std::printf("ratio dispatched / direct, median of per-round ratios: %.4f  [target <= 1.01: %s]\n", ratio,
              ratio <= 1.01 ? "met" : "NOT met");
}
