// One job of the Accelerate comparison (bench/accelerate_compare.py): the tiny MLP step of bench/mlp_step.cpp
// (64 -> 64 -> 64 -> 1, AdamW, batch 64 per process, one thread per process) through accel, on one process
// (`accelerator<>`) or on every process of a Gloo job (`accelerator<fp32, data_parallel<gloo>>`, started by
// `accel launch`). bench/accelerate_step.py is the same job through Hugging Face Accelerate.
// Process 0 prints one line: `accel PROCESSES US_PER_STEP`.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "support.hpp"

namespace {

template <class Accelerator>
double microseconds_per_step(int steps, int warmup) {
  Accelerator acc{{.cpu = true}};
  auto net = bench::tiny_mlp();
  torch::optim::AdamW optimizer(net->parameters(), 1e-3);
  auto [model, opt] = acc.prepare(net, optimizer);
  torch::manual_seed(1 + acc.process_index());
  const auto data = bench::tiny_batches();
  auto step = [&](int i) {
    const auto& [x, y] = data[static_cast<std::size_t>(i) % data.size()];
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  };
  for (int i = 0; i < warmup; ++i) step(i);
  acc.wait_for_everyone();
  const auto start = bench::clock_type::now();
  for (int i = 0; i < steps; ++i) step(i);
  acc.wait_for_everyone();
  const double us = bench::seconds_since(start) * 1e6 / steps;
  if (acc.is_main_process()) std::printf("accel %d %.3f\n", acc.num_processes(), us);
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s single|data_parallel STEPS WARMUP\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const int steps = std::atoi(argv[2]), warmup = std::atoi(argv[3]);
  torch::set_num_threads(1);
  if (mode == "single")
    microseconds_per_step<accel::accelerator<>>(steps, warmup);
  else
    microseconds_per_step<accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>>(steps, warmup);
}
