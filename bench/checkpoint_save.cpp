// How long a checkpoint stops training: save_state while the program waits against save_state with
// save_options::asynchronous, side by side in each round, on one process (scripts/bench.sh checkpoint).
// `bench_checkpoint_save DIR [ROUNDS]`: a 4 x 2560 MLP with AdamW (26 M parameters: 105 MB of weights, 210 MB of
// optimizer state, 315 MB of training state). Each round: 6 steps with no save; the save the program waits for; then
// an asynchronous save at each write duty cycle (1: flat out, 0.5: the default), each followed by the steps that run
// while it writes (until its manifest is in place) and 3 steps after. Per round: the time each save blocks, how long
// the background write takes, and the mean step time while it writes over the mean step time without a save (the 6
// steps before the saves and the 3 after this one: this VM's step time drifts within a round). Medians over the rounds
// after the first (whose snapshot buffers are new: its blocked time is shown apart).
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

double mean(const std::vector<double>& values) {
  return values.empty() ? 0.0 : std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

constexpr double duty_cycles[] = {1.0, 0.5};

struct round_result {
  double step = 0, waited = 0;
  double blocked[2] = {}, written[2] = {}, slowdown[2] = {};
  int steps_while_writing[2] = {};
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_checkpoint_save DIR [ROUNDS]\n");
    return 2;
  }
  const std::filesystem::path root = argv[1];
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  accel::detail::remove_tree(root);
  accel::accelerator<> acc{accel::options{.cpu = true}};
  auto net = bench::wide_mlp(2560);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-4));
  auto [model, opt] = acc.prepare(net, optimizer);
  torch::manual_seed(1);
  const auto x = torch::randn({32, 2560}), y = torch::randn({32, 1});
  const auto step = [&] {
    const auto start = bench::clock_type::now();
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
    return bench::seconds_since(start);
  };
  for (int i = 0; i < 3; ++i) step();
  std::vector<round_result> results;
  for (int round = 0; round < rounds + 1; ++round) {
    round_result r;
    std::vector<double> plain;
    for (int i = 0; i < 6; ++i) plain.push_back(step());
    r.step = mean(plain);
    auto start = bench::clock_type::now();
    acc.save_state(root / "waited");
    r.waited = bench::seconds_since(start);
    for (int d = 0; d < 2; ++d) {
      const auto directory = root / ("background_" + std::to_string(d));
      accel::detail::remove_tree(directory);
      start = bench::clock_type::now();
      acc.save_state(directory, {.asynchronous = true, .write_duty_cycle = duty_cycles[d]});
      r.blocked[d] = bench::seconds_since(start);
      std::vector<double> writing;
      while (!std::filesystem::exists(directory / "accel_checksums.txt")) writing.push_back(step());
      (void)accel::wait_for_checkpoint(acc);
      r.written[d] = bench::seconds_since(start);
      std::vector<double> after = plain;  // the baseline: the steps before the saves and those right after this one
      for (int i = 0; i < 3; ++i) after.push_back(step());
      r.slowdown[d] = mean(writing) / mean(after);
      r.steps_while_writing[d] = static_cast<int>(writing.size());
    }
    results.push_back(r);
    std::printf(
        "round %d: step %.1f ms; waited save %.3f s; asynchronous, duty cycle 1: blocked %.1f ms, written in "
        "%.3f s, %d steps x%.3f; duty cycle 0.5: blocked %.1f ms, written in %.3f s, %d steps x%.3f\n",
        round, r.step * 1e3, r.waited, r.blocked[0] * 1e3, r.written[0], r.steps_while_writing[0], r.slowdown[0],
        r.blocked[1] * 1e3, r.written[1], r.steps_while_writing[1], r.slowdown[1]);
  }
  const auto pick = [&](auto field) {
    std::vector<double> values;
    for (std::size_t i = 1; i < results.size(); ++i) values.push_back(field(results[i]));
    return median(values);
  };
  const double waited = pick([](const round_result& r) { return r.waited; });
  std::printf("\n| 315 MB training state, 1 process, medians of %d rounds | value |\n|---|---|\n", rounds);
  std::printf("| step without a save | %.1f ms |\n", pick([](const round_result& r) { return r.step; }) * 1e3);
  std::printf("| save_state, waited for: training blocked | %.3f s |\n", waited);
  for (int d = 0; d < 2; ++d) {
    const double blocked = pick([d](const round_result& r) { return r.blocked[d]; });
    std::printf(
        "| asynchronous, write duty cycle %.1f: training blocked | %.1f ms (%.1f%% of the waited save; per "
        "round: %.1f%%) |\n",
        duty_cycles[d], blocked * 1e3, 100 * blocked / waited,
        100 * pick([d](const round_result& r) { return r.blocked[d] / r.waited; }));
    std::printf("| asynchronous, write duty cycle %.1f: background write | %.3f s |\n", duty_cycles[d],
                pick([d](const round_result& r) { return r.written[d]; }));
    std::printf("| asynchronous, write duty cycle %.1f: step while it writes / step without a save | x%.3f |\n",
                duty_cycles[d], pick([d](const round_result& r) { return r.slowdown[d]; }));
  }
  std::printf("| the first asynchronous save (new snapshot buffers): training blocked | %.1f ms |\n",
              results[0].blocked[0] * 1e3);
  return 0;
}
