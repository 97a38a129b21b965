// One accel job of the mesh benchmark (bench/mesh_compare.py runs it under `accel launch --nproc_per_node 4
// --parallelism_config_dp_replicate_size 2 --parallelism_config_dp_shard_size 2`): the MLP of bench/ddp_step.cpp at
// the given width, AdamW, batch 32 per process, one thread per process, on Gloo. Policies: hybrid_sharded (the
// shard group's parameters gathered whole once per step) and hybrid_sharded_units (each Linear an accel::shard_unit,
// resharded after forward: FSDP2's default per layer). Process 0 prints one line:
//   `policy width ms_per_step optimizer_state_bytes_per_process dp_shard_bytes_per_step dp_replicate_bytes_per_step`
// where the bytes are what process 0 sends on each mesh dimension in one step, counted from what that step handed to
// collectives with a ring's share: (S-1)/S of what is reduce-scattered or all-gathered in the shard group of S,
// 2 (R-1)/R of what is all-reduced across the R replicas.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "support.hpp"

namespace {

std::int64_t state_bytes(torch::optim::Optimizer& optimizer) {
  std::int64_t bytes = 0;
  for (auto& [key, state] : optimizer.state())
    if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state.get()))
      bytes += (adamw->exp_avg().numel() + adamw->exp_avg_sq().numel()) * 4;
  return bytes;
}

/// What one step hands to the collectives of each mesh dimension, in bytes: (dp_shard, dp_replicate).
struct handed_bytes {
  double shard = 0;
  double replica = 0;
};

int run(const std::string& policy, int width, int steps, int warmup) {
  accel::accelerator<accel::fp32, accel::hybrid_sharded<accel::gloo>> acc;
  auto net = bench::wide_mlp(width, /*units=*/policy == "hybrid_sharded_units");
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(net, optimizer);
  const auto data = bench::wide_batches(width, acc.process_index());
  const auto step = [&](int i) {
    const auto& [x, y] = data[static_cast<std::size_t>(i) % data.size()];
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  };
  const double ms = bench::seconds_per_step(acc, step, steps, warmup) * 1e3;
  const auto* reducer = acc.parallel().reducer_for(*net);
  const auto* shards = acc.parallel().shards_of(optimizer);
  const auto handed = [&] {
    return handed_bytes{.shard = static_cast<double>(shards->all_gathered_bytes() + reducer->payload_elements() * 4),
                        .replica = static_cast<double>(reducer->replica_elements() * 4)};
  };
  const auto before = handed();
  step(0);  // one more step, counted
  const auto after = handed();
  const auto& sizes = acc.parallelism_config()->sizes();  // hybrid_sharded refuses a job without one
  const double S = sizes.dp_shard, R = sizes.dp_replicate;
  if (acc.is_main_process())
    std::printf("%s %d %.4f %lld %.0f %.0f\n", policy.c_str(), width, ms,
                static_cast<long long>(state_bytes(optimizer)), (after.shard - before.shard) * (S - 1) / S,
                (after.replica - before.replica) * 2 * (R - 1) / R);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s hybrid_sharded|hybrid_sharded_units WIDTH STEPS WARMUP\n", argv[0]);
    return 2;
  }
  const std::string policy = argv[1];
  if (policy != "hybrid_sharded" && policy != "hybrid_sharded_units") {
    std::fprintf(stderr, "%s: unknown policy '%s'\n", argv[0], policy.c_str());
    return 2;
  }
  torch::set_num_threads(1);
  return run(policy, std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
}
