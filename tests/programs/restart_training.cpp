// For tests/scripts/restart_after_kill.py: `restart_training PROJECT_DIR OUT_FILE [async]`, run on 2 Gloo processes
// under `accel launch --max_restarts`, trains 200 optimizer steps (dropout, AdamW, a shuffled data loader),
// checkpointing every 20 steps into PROJECT_DIR and resuming by itself from the newest checkpoint when the job is
// restarted. The main process then writes the final parameters to OUT_FILE (safetensors), which must not depend on
// restarts. Every process prints a line per step (the harness kills at a chosen step) and where it resumed from. With
// `async` the checkpoints are written in the background (tests/scripts/async_kill_and_resume.py).
#include "accel_headers.hpp"
#include <torch/torch.h>
#include <unistd.h>

#include "support.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace programs::restart_training {

int run(int argc, char** argv) {
  const bool in_background = argc == 4 && std::string(argv[3]) == "async";
  if (argc != 3 && !in_background) {
    std::fprintf(stderr, "usage: restart_training PROJECT_DIR OUT_FILE [async]\n");
    return 2;
  }
  constexpr std::int64_t total_steps = 200;
  // Wide enough (~1 MB of weights, ~3 MB of AdamW state) that a save lasts long enough for the harness to kill a
  // process during it; 400 samples of 16 features: 25 batches of 8 an epoch, 13 a process.
  constexpr int features = 16, hidden = 16384, sample_count = 400;
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc{accel::options{
      .cpu = true, .project = {.project_dir = argv[1], .automatic_checkpoint_naming = true, .total_limit = 2}}};
  accel::checkpoint_automatically(
      acc, {.every_steps = 20, .resume = accel::resume::latest, .save = {.asynchronous = in_background}});
  // Every attempt starts from the same weights and data; what differs after a restart comes from the checkpoint.
  torch::manual_seed(7);
  accel_test::mlp net(features, hidden, 1, /*dropout=*/0.3);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::manual_seed(42);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> samples;
  for (int i = 0; i < sample_count; ++i) samples.emplace_back(torch::randn({features}), torch::randn({1}));
  accel::data_loader loader(samples, {.batch_size = 8, .shuffle = true, .seed = 3});
  auto [model, opt, batches] = acc.prepare(net, optimizer, loader);
  torch::manual_seed(1000 + acc.process_index());  // dropout differs per process; a checkpoint restores it

  const int rank = acc.process_index();
  const char* restart_count = std::getenv("ACCEL_RESTART_COUNT");
  const int attempt = restart_count != nullptr ? std::atoi(restart_count) : 0;
  bool announced = false;
  while (acc.completed_steps() < total_steps)
    for (auto&& [x, y] : batches) {
      if (!announced) {  // the first pass's begin() has loaded the newest checkpoint, if any
        announced = true;
        if (const auto& from = acc.resumed_from())
          std::printf("restart_training: rank %d attempt %d resumed from %s at step %lld\n", rank, attempt,
                      from->c_str(), static_cast<long long>(acc.completed_steps()));
        else
          std::printf("restart_training: rank %d attempt %d found no checkpoint: starting at step 0\n", rank, attempt);
      }
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      opt.zero_grad();
      std::printf("restart_training: rank %d pid %d attempt %d step %lld\n", rank, static_cast<int>(getpid()), attempt,
                  static_cast<long long>(acc.completed_steps()));
      std::fflush(stdout);
      if (acc.completed_steps() == total_steps) break;
    }
  if (acc.is_main_process()) accel::safetensors::save(argv[2], acc.get_state_dict(model));
  return 0;
}

}  // namespace programs::restart_training
