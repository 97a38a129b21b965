// What a prepared range adds to iterating the plain range of tensor batches, side by side in one run: 64 batches
// of (64 x 64, 64 x 1) float tensors already on the CPU, and per batch the smallest real consumer, one reduction
// (`x.sum() + y.sum()`). The prepared range reads one batch ahead, checks the device and marks the last batch.
// 21 rounds x 200 passes, alternating order; the ratio is the median of per-round ratios (target < 1.02).
#include <accel/accel.hpp>
#include <torch/torch.h>

#include "support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {
using bench::clock_type;

template <class Range>
double seconds_per_pass(Range& range, int passes, float& sink) {
  const auto start = clock_type::now();
  for (int p = 0; p < passes; ++p)
    for (auto&& [x, y] : range) sink += (x.sum() + y.sum()).template item<float>();
  return bench::seconds_since(start) / passes;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 21;
  const int passes = argc > 2 ? std::atoi(argv[2]) : 200;
  torch::set_num_threads(1);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  for (int i = 0; i < 64; ++i) data.emplace_back(torch::randn({64, 64}), torch::randn({64, 1}));
  accel::accelerator<> acc{{.cpu = true}};
  auto prepared = acc.prepare(data);
  float sink = 0;
  seconds_per_pass(data, passes / 4, sink);  // warm-up
  seconds_per_pass(prepared, passes / 4, sink);
  std::vector<double> plain, accel_times, ratios;
  for (int r = 0; r < rounds; ++r) {
    double a, b;
    if (r % 2 == 0) {
      a = seconds_per_pass(data, passes, sink);
      b = seconds_per_pass(prepared, passes, sink);
    } else {
      b = seconds_per_pass(prepared, passes, sink);
      a = seconds_per_pass(data, passes, sink);
    }
    plain.push_back(a);
    accel_times.push_back(b);
    ratios.push_back(b / a);
  }
  std::printf("range of 64 tensor batches, one reduction per batch, %d rounds x %d passes (checksum %g)\n", rounds,
              passes, static_cast<double>(sink));
  std::printf("%-28s %14s\n", "range", "us per batch");
  std::printf("%-28s %14.3f\n", "plain std::vector", bench::median(plain) * 1e6 / 64);
  std::printf("%-28s %14.3f\n", "accel prepared_range", bench::median(accel_times) * 1e6 / 64);
  const double ratio = bench::median(ratios);
  std::printf("ratio prepared / plain (median of per-round ratios): %.4f  [target < 1.02: %s]\n", ratio,
              ratio < 1.02 ? "met" : "NOT met");
}
