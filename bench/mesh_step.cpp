// One accel job of the mesh benchmark (bench/mesh_compare.py runs it under `accel launch` with the mesh's sizes): the
// MLP of bench/ddp_step.cpp at the given width, AdamW, batch 32 per process, one thread per process, on Gloo.
// Policies: hybrid_sharded (on dp_replicate 2 x dp_shard 2; the shard group's parameters gathered whole once per step),
// hybrid_sharded_units (each Linear an accel::shard_unit, resharded after forward: FSDP2's default per layer) and
// tensor_parallel (on tp 2, alone or beside dp 2: the hidden Linear layers in column/row-parallel pairs, Megatron's
// MLP) and fully_sharded_tensor_parallel (the same split on dp_shard 2 x tp 2, the tp slices sharded over dp_shard as
// fully_sharded shards a model, gathered whole once per step). Process 0 prints one line:
//   `policy width ms_per_step optimizer_state_bytes_per_process first_dimension_bytes second_dimension_bytes`
// the dimensions dp_shard and dp_replicate for hybrid_sharded, tp and dp for the tensor-parallel ones: what process 0
// sends on each in one step, counted from what that step handed to collectives with a ring's share: (n-1)/n of what is
// reduce-scattered or all-gathered in a group of n, 2 (n-1)/n of what is all-reduced.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "support.hpp"

namespace {

/// What one step hands to the collectives of each mesh dimension, in bytes: (dp_shard, dp_replicate).
struct handed_bytes {
  double shard = 0;
  double replica = 0;
};

/// What hybrid_sharded has handed to collectives so far, per mesh dimension (its own counters).
template <class Accelerator, class Net>
handed_bytes handed_by_hybrid(Accelerator& acc, Net& net, torch::optim::Optimizer& optimizer) {
  const auto* reducer = acc.parallel().reducer_for(*net);
  const auto* shards = acc.parallel().shards_of(optimizer);
  return {.shard = static_cast<double>(shards->all_gathered_bytes() + reducer->payload_elements() * 4),
          .replica = static_cast<double>(reducer->replica_elements() * 4)};
}

/// Megatron's MLP over tp: each hidden Linear pair column- then row-parallel (the last Linear replicated).
const accel::tensor_parallel_plan mlp_plan{{"0", accel::colwise_parallel{}},
                                           {"2", accel::rowwise_parallel{}},
                                           {"4", accel::colwise_parallel{}},
                                           {"6", accel::rowwise_parallel{}}};

template <class Parallel>
int run(const std::string& policy, int width, int steps, int warmup) {
  accel::accelerator<accel::fp32, Parallel> acc;
  auto net = bench::wide_mlp(width, /*units=*/policy == "hybrid_sharded_units");
  constexpr bool sharded_tp = std::is_same_v<Parallel, accel::fully_sharded_tensor_parallel<accel::gloo>>;
  constexpr bool tensor_parallel = sharded_tp || std::is_same_v<Parallel, accel::tensor_parallel<accel::gloo>>;
  if constexpr (tensor_parallel) accel::parallelize_module(acc, net, mlp_plan);
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
  const auto& sizes = acc.parallelism_config()->sizes();  // both policies refuse a job without a mesh
  const auto handed = [&] {
    if constexpr (tensor_parallel) {  // each all-reduce over tp: the batch's activations at the full width
      const auto counts = acc.parallel().all_reduces();
      const auto* reducer = acc.parallel().reducer_for(*net);
      const double tp_bytes =
          static_cast<double>(counts.forward_all_reduces + counts.backward_all_reduces) * 32 * width * 4;
      if constexpr (sharded_tp)  // over dp_shard: the all-gathers and reduce-scatters
        return handed_bytes{.shard = tp_bytes, .replica = handed_by_hybrid(acc, net, optimizer).shard};
      else
        return handed_bytes{.shard = tp_bytes,
                            .replica = reducer == nullptr ? 0.0 : static_cast<double>(reducer->payload_elements() * 4)};
    } else {
      return handed_by_hybrid(acc, net, optimizer);
    }
  };
  const auto before = handed();
  step(0);  // one more step, counted
  const auto after = handed();
  const double first = tensor_parallel ? sizes.tp : sizes.dp_shard;
  const double second = tensor_parallel ? acc.num_processes() / sizes.tp : sizes.dp_replicate;
  const double first_share = tensor_parallel ? 2 * (first - 1) / first : (first - 1) / first;
  const double second_share = sharded_tp ? (second - 1) / second : 2 * (second - 1) / second;  // gathers or all-reduces
  if (acc.is_main_process())
    std::printf("%s %d %.4f %lld %.0f %.0f\n", policy.c_str(), width, ms,
                static_cast<long long>(bench::adamw_state_bytes(optimizer)), (after.shard - before.shard) * first_share,
                (after.replica - before.replica) * second_share);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr,
                 "usage: %s hybrid_sharded|hybrid_sharded_units|tensor_parallel|fully_sharded_tensor_parallel WIDTH "
                 "STEPS WARMUP\n",
                 argv[0]);
    return 2;
  }
  const std::string policy = argv[1];
  const int width = std::atoi(argv[2]), steps = std::atoi(argv[3]), warmup = std::atoi(argv[4]);
  torch::set_num_threads(1);
  if (policy == "hybrid_sharded" || policy == "hybrid_sharded_units")
    return run<accel::hybrid_sharded<accel::gloo>>(policy, width, steps, warmup);
  if (policy == "tensor_parallel") return run<accel::tensor_parallel<accel::gloo>>(policy, width, steps, warmup);
  if (policy == "fully_sharded_tensor_parallel")
    return run<accel::fully_sharded_tensor_parallel<accel::gloo>>(policy, width, steps, warmup);
  std::fprintf(stderr, "%s: unknown policy '%s'\n", argv[0], policy.c_str());
  return 2;
}
