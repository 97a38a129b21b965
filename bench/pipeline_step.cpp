// One job of the pipeline benchmark (bench/pipeline_compare.py runs it under `accel launch
// --parallelism_config_pp_size P`, or alone for one process): one thread per process, Gloo.
//   bench_pipeline_step SCHEDULE STAGES_PER_PROCESS MICRO_BATCHES STEPS WARMUP [WIDTH ROWS [LAYERS]]
// trains an MLP of LAYERS (8) Linear(WIDTH, WIDTH) + Tanh pairs (512) through accel::pipeline (SCHEDULE: gpipe, 1f1b,
// interleaved, zero_bubble), micro-batches of ROWS rows (32), and prints on process 0: `schedule processes
// stages_per_process micro_batches seconds_per_step bubble_formula measured_bubble bubble_at_measured_costs`:
// the share of each step's span the processes spent not computing, from `pipeline::last_step_timing`, averaged over
// the steps; and what the schedule's bubble is, messages free, when each action costs what it did here (each
// process's mean time per forward, backward or its input part, and weight part, in each step, through
// simulate_pipeline), averaged over the steps.
#include <accel/accel.hpp>
#include <accel/pipeline.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "support.hpp"

int main(int argc, char** argv) {
  if (argc != 6 && argc != 8 && argc != 9) {
    std::fprintf(stderr,
                 "usage: bench_pipeline_step gpipe|1f1b|interleaved|zero_bubble STAGES_PER_PROCESS "
                 "MICRO_BATCHES STEPS WARMUP [WIDTH ROWS [LAYERS]]\n");
    return 2;
  }
  const std::map<std::string, accel::pipeline_schedule> schedules{
      {"gpipe", accel::pipeline_schedule::gpipe},
      {"1f1b", accel::pipeline_schedule::one_f_one_b},
      {"interleaved", accel::pipeline_schedule::interleaved_1f1b},
      {"zero_bubble", accel::pipeline_schedule::zero_bubble}};
  const std::string schedule = argv[1];
  const int stages_per_process = std::atoi(argv[2]), micro_batches = std::atoi(argv[3]);
  const int steps = std::atoi(argv[4]), warmup = std::atoi(argv[5]);
  const int width = argc >= 8 ? std::atoi(argv[6]) : 512, rows = argc >= 8 ? std::atoi(argv[7]) : 32;
  const int layers = argc == 9 ? std::atoi(argv[8]) : 8;
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc{accel::options{.cpu = true}};
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int layer = 0; layer < layers; ++layer) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::Tanh());
  }
  accel::pipeline pipe(
      acc, model,
      {.schedule = schedules.at(schedule), .micro_batches = micro_batches, .stages_per_process = stages_per_process});
  torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(1e-3));
  // The input requires grad, so that every stage computes the same: the formula counts equal stages, and a first
  // stage that skips its input's gradient does 11 of the others' 12 products, which its peers then wait for.
  const auto x = torch::randn({rows * micro_batches, width}).requires_grad_();
  const auto y = torch::randn({rows * micro_batches, width});
  const auto mse = [](const at::Tensor& output, const at::Tensor& target) { return torch::mse_loss(output, target); };
  const auto step = [&] {
    (void)pipe.step(x, y, mse);
    optimizer.step();
    optimizer.zero_grad();
  };
  for (int i = 0; i < warmup; ++i) step();
  acc.wait_for_everyone();
  const auto start = bench::clock_type::now();
  // Each step's schedule time and the part of it computing, on this process.
  auto timings = torch::zeros({steps, 5}, torch::kDouble);
  for (int i = 0; i < steps; ++i) {
    // Every step's schedule starts on every process at once, as the formula's does: a process's optimizer step
    // does not overlap the others' next schedule.
    acc.wait_for_everyone();
    step();
    timings[i][0] = pipe.last_step_timing().seconds;
    timings[i][1] = pipe.last_step_timing().computing;
    const auto& costs = pipe.last_step_timing().costs;
    timings[i][2] = costs.forward;
    timings[i][3] = costs.backward_input;
    timings[i][4] = costs.backward_weight;
  }
  acc.wait_for_everyone();
  const double seconds = bench::seconds_since(start) / steps;
  // The measured bubble, as the formula counts it: of each step's span (from the common start to the last process's
  // end), the share the processes spent not computing, averaged over the processes, then over the steps.
  const auto all = acc.gather(timings).view({acc.num_processes(), steps, 5});
  const auto span = std::get<0>(all.select(2, 0).max(0));
  const auto measured_bubble = (1 - all.select(2, 1).mean(0) / span).mean().item<double>();
  const accel::pipeline_shape shape{.stages = acc.num_processes() * stages_per_process,
                                    .micro_batches = micro_batches,
                                    .processes = acc.num_processes()};
  // Each step simulated with each process's own costs that step (its mean time per kind of action): stages that
  // differ by a few percent in speed make the faster wait every round, as the simulator then counts too.
  const auto actions = accel::make_pipeline_schedule(schedules.at(schedule), shape);
  double at_measured_costs = 0;
  for (int i = 0; i < steps; ++i) {
    std::vector<accel::pipeline_costs> costs;
    for (int process = 0; process < acc.num_processes(); ++process) {
      const auto cost = [&](int kind) { return all[process][i][kind].item<double>(); };
      costs.push_back({.forward = cost(2), .backward_input = cost(3), .backward_weight = cost(4)});
    }
    at_measured_costs += accel::simulate_pipeline(actions, shape, costs).bubble / steps;
  }
  if (acc.is_main_process())
    std::printf("%s %d %d %d %.6f %.6f %.6f %.6f\n", schedule.c_str(), acc.num_processes(), stages_per_process,
                micro_batches, seconds, accel::pipeline_bubble_formula(schedules.at(schedule), shape), measured_bubble,
                at_measured_costs);
  return 0;
}
