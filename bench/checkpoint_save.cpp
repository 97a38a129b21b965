// How long a checkpoint stops training: save_state while the program waits against save_state with
// save_options::asynchronous, side by side in each round, on one process (scripts/bench.sh checkpoint).
// `bench_checkpoint_save DIR [ROUNDS]`: a 4 x 2560 MLP with AdamW (26 M parameters: 105 MB of weights, 210 MB of
// optimizer state, 315 MB of training state). Each round: the step time with no save (median of 10 steps); the
// time save_state blocks when the program waits for it; the time it blocks when asynchronous, how long the background
// write then takes, and the step time while it writes (the steps until its manifest is in place). Medians over the
// rounds after the first (whose snapshot buffers are new), and the first round's blocked time apart.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

struct round_result {
  double step = 0, waited = 0, blocked = 0, background = 0, step_while_writing = 0;
  int steps_while_writing = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_checkpoint_save DIR [ROUNDS]\n");
    return 2;
  }
  const std::filesystem::path root = argv[1];
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  std::filesystem::remove_all(root);
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
    for (int i = 0; i < 10; ++i) plain.push_back(step());
    r.step = median(plain);
    auto start = bench::clock_type::now();
    acc.save_state(root / "waited");
    r.waited = bench::seconds_since(start);
    const auto background = root / ("background_" + std::to_string(round));
    if (round > 0) std::filesystem::remove_all(root / ("background_" + std::to_string(round - 1)));
    start = bench::clock_type::now();
    acc.save_state(background, {.asynchronous = true});
    r.blocked = bench::seconds_since(start);
    std::vector<double> writing;
    while (!std::filesystem::exists(background / "accel_checksums.txt")) writing.push_back(step());
    (void)accel::wait_for_checkpoint(acc);
    r.background = bench::seconds_since(start);
    r.step_while_writing = median(writing);
    r.steps_while_writing = static_cast<int>(writing.size());
    results.push_back(r);
    std::printf(
        "round %d: step %.1f ms; waited save %.3f s; asynchronous: blocked %.1f ms, written in %.3f s, %d steps "
        "of %.1f ms meanwhile\n",
        round, r.step * 1e3, r.waited, r.blocked * 1e3, r.background, r.steps_while_writing,
        r.step_while_writing * 1e3);
  }
  const auto pick = [&](auto field) {
    std::vector<double> values;
    for (std::size_t i = 1; i < results.size(); ++i) values.push_back(field(results[i]));
    return median(values);
  };
  const double step_time = pick([](const round_result& r) { return r.step; });
  const double waited = pick([](const round_result& r) { return r.waited; });
  const double blocked = pick([](const round_result& r) { return r.blocked; });
  const double written = pick([](const round_result& r) { return r.background; });
  const double during = pick([](const round_result& r) { return r.step_while_writing; });
  std::printf("\n| 315 MB training state, 1 process, median of %d rounds | value |\n|---|---|\n", rounds);
  std::printf("| save_state, waited for | %.3f s |\n", waited);
  std::printf("| asynchronous save_state: training blocked | %.1f ms (%.1f%% of the waited save) |\n", blocked * 1e3,
              100 * blocked / waited);
  std::printf("| the same, first save (new snapshot buffers) | %.1f ms |\n", results[0].blocked * 1e3);
  std::printf("| background write, from the call to the manifest in place | %.3f s |\n", written);
  std::printf("| step time without a save / while a save writes | %.1f ms / %.1f ms (x%.3f) |\n", step_time * 1e3,
              during * 1e3, during / step_time);
  return 0;
}
