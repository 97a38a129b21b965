// One job of the communication hook benchmark (bench/comm_hooks_compare.py runs it under `accel launch`): the MLP of
// bench/ddp_step.cpp at the given width on 2 Gloo processes, data_parallel with options::comm_hook, SGD, batch 32 per
// process, one thread per process. Hooks: none, fp16, bf16, power_sgd_rank1, power_sgd_rank4 (PowerSGD from the
// second step: start_power_sgd_iter = 2, so every timed step compresses), each also as HOOK_one_bucket: the whole
// model in one bucket (bucket caps of 1000 MiB; PyTorch's PowerSGD hook only runs on Gloo so). Process 0 prints:
//   `hook width ms_per_step bytes_per_step`
// where the bytes are what this process handed to the gradient collectives per timed step.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "support.hpp"

int main(int argc, char** argv) {
  const std::map<std::string, accel::comm_hook_options> hooks{
      {"none", {}},
      {"fp16", {.hook = accel::comm_hook::fp16}},
      {"bf16", {.hook = accel::comm_hook::bf16}},
      {"power_sgd_rank1",
       {.hook = accel::comm_hook::power_sgd, .power_sgd = {.matrix_approximation_rank = 1, .start_power_sgd_iter = 2}}},
      {"power_sgd_rank4",
       {.hook = accel::comm_hook::power_sgd, .power_sgd = {.matrix_approximation_rank = 4, .start_power_sgd_iter = 2}}},
  };
  const std::string hook = argc > 1 ? argv[1] : "";
  const std::string suffix = "_one_bucket";
  const bool one_bucket = hook.ends_with(suffix);
  const auto options = hooks.find(one_bucket ? hook.substr(0, hook.size() - suffix.size()) : hook);
  if (argc != 5 || options == hooks.end()) {
    std::fprintf(stderr, "usage: %s none|fp16|bf16|power_sgd_rank1|power_sgd_rank4[_one_bucket] WIDTH STEPS WARMUP\n",
                 argv[0]);
    return 2;
  }
  const int width = std::atoi(argv[2]), steps = std::atoi(argv[3]), warmup = std::atoi(argv[4]);
  torch::set_num_threads(1);
  const auto buckets =
      one_bucket ? accel::bucket_options{.first_bucket_mb = 1000, .bucket_cap_mb = 1000} : accel::bucket_options{};
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc{
      accel::options{.buckets = buckets, .comm_hook = options->second}};
  auto net = bench::wide_mlp(width);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  auto [model, opt] = acc.prepare(net, optimizer);
  const auto data = bench::wide_batches(width, acc.process_index());
  const auto* reducer = acc.parallel().reducer_for(*net);
  std::uint64_t bytes_before = 0;
  const auto step = [&](int i) {
    if (i == 0) bytes_before = reducer->communicated_bytes();  // the timed steps' first call (after the warm-up's)
    const auto& [x, y] = data[i % data.size()];
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  };
  const double ms = bench::seconds_per_step(acc, step, steps, warmup) * 1e3;
  const double bytes = static_cast<double>(reducer->communicated_bytes() - bytes_before) / steps;
  if (acc.is_main_process()) std::printf("%s %d %.4f %.0f\n", hook.c_str(), width, ms, bytes);
}
