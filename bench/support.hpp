// What the benchmarks share: the tiny MLP setting where any per-step cost shows most, the median over rounds, and
// the table rows.
#pragma once

#include <accel/shard_unit.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

namespace bench {

using clock_type = std::chrono::steady_clock;
using batch = std::pair<torch::Tensor, torch::Tensor>;

constexpr int tiny_width = 64;
constexpr int tiny_batch_size = 64;

/// 64 -> 64 -> 64 -> 1 with ReLU, the same weights every time.
inline torch::nn::Sequential tiny_mlp() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(tiny_width, tiny_width), torch::nn::ReLU(),
                               torch::nn::Linear(tiny_width, tiny_width), torch::nn::ReLU(),
                               torch::nn::Linear(tiny_width, 1));
}

/// 16 batches of (64 x 64, 64 x 1), cycled by the loops.
inline std::vector<batch> tiny_batches() {
  torch::manual_seed(1);
  std::vector<batch> data;
  for (int i = 0; i < 16; ++i)
    data.emplace_back(torch::randn({tiny_batch_size, tiny_width}), torch::randn({tiny_batch_size, 1}));
  return data;
}

inline double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

/// The multi-process benchmarks' model: 4 hidden layers of `width` with ReLU, then 1 output, the same weights every
/// time (bench/ddp_step.py builds the same one). With `units`, each Linear is an accel::shard_unit.
inline torch::nn::Sequential wide_mlp(int width, bool units = false) {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < 5; ++i) {
    torch::nn::Linear layer(width, i < 4 ? width : 1);
    if (units)
      net->push_back(accel::shard_unit(layer));
    else
      net->push_back(layer);
    if (i < 4) net->push_back(torch::nn::ReLU());
  }
  return net;
}

/// Bytes of AdamW state (exp_avg and exp_avg_sq, float32) this process's optimizer holds: under a sharded policy, its
/// shards' only.
inline std::int64_t adamw_state_bytes(torch::optim::Optimizer& optimizer) {
  std::int64_t bytes = 0;
  for (auto& [key, state] : optimizer.state())
    if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state.get()))
      bytes += (adamw->exp_avg().numel() + adamw->exp_avg_sq().numel()) * 4;
  return bytes;
}

/// 16 batches of (32 x width, 32 x 1), different on each process, cycled by the loops.
inline std::vector<batch> wide_batches(int width, int process_index) {
  torch::manual_seed(1 + process_index);
  std::vector<batch> data;
  for (int i = 0; i < 16; ++i) data.emplace_back(torch::randn({32, width}), torch::randn({32, 1}));
  return data;
}

/// Seconds per call of `step(i)` over `steps` calls after `warmup` untimed ones, every process starting and ending
/// the timed calls together.
template <class Accelerator, class Step>
double seconds_per_step(Accelerator& acc, Step&& step, int steps, int warmup) {
  for (int i = 0; i < warmup; ++i) step(i);
  acc.wait_for_everyone();
  const auto start = clock_type::now();
  for (int i = 0; i < steps; ++i) step(i);
  acc.wait_for_everyone();
  return seconds_since(start) / steps;
}

/// The median: the figure each benchmark reports over rounds, robust to a round disturbed by the machine.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// A table row: the median and the minimum of per-step times given in seconds, in microseconds.
inline void print_row(const char* name, const std::vector<double>& seconds) {
  std::printf("%-44s %12.2f %12.2f\n", name, median(seconds) * 1e6,
              *std::min_element(seconds.begin(), seconds.end()) * 1e6);
}

}  // namespace bench
