/// \file
/// What `accel::pipeline` (accel/pipeline.hpp) needs of the job, as functions: the pipeline itself is then no
/// template, compiled once (accel::compiled).
// IWYU pragma: private, include <accel/pipeline.hpp>
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../../collectives.hpp"
#include "../../device_mesh.hpp"
#include "../prepared/accelerator_access.hpp"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace accel::detail::pp {

/// What a pipeline needs of the job: its place in the "pp" group and the messages and collectives over it and over
/// its "dp" group, as functions, so that the pipeline itself is compiled once (accel::compiled).
struct links {
  int rank = 0;  ///< in the pp group
  int size = 1;
  /// Start a send (receive) of message `tag` to (from) `peer` in the pp group; the function returned waits for it.
  std::function<std::function<void()>(at::Tensor&, int peer, int tag)> send{}, receive{};
  std::function<void(at::Tensor&, int root)> broadcast{};  ///< over the pp group
  int replicas = 1;                                        ///< the data-parallel ranks: dp_replicate x dp_shard
  int replica_index = 0;                                   ///< in the dp group
  /// Sums a gradient over the copies of what this process holds of it: the dp group, or under dp_shard the
  /// dp_replicate group (each shard's copies); empty: no copies.
  std::function<void(at::Tensor&)> sum_over_replicas{};
  /// dp_shard: each stage's parameters cut across the dp_shard group (FSDP's), gathered whole for a step.
  int shards = 1;
  int shard_index = 0;
  /// `whole` (shards x n) receives every member's `mine` (n) in rank order; `mine` receives the sum of every
  /// member's segment of `whole` for this one.
  std::function<void(at::Tensor& whole, at::Tensor& mine)> all_gather_shards{}, reduce_scatter_shards{};
  /// tp: the stages' layers split across the tp group (`accel::parallelize_module` under `tensor_parallel`), each
  /// stage's copies on the tp group's processes exchanging their activations with the same tp index.
  int tp = 1;
  int tp_index = 0;
  /// Runs an action (a save or load of the whole model) with the split layers' parameters whole, slicing again
  /// what it wrote into them (the policy's `with_full_parameters`; a collective of the tp group).
  std::function<void(torch::nn::Module&, const std::function<void()>&)> with_whole_layers =
      [](torch::nn::Module&, const std::function<void()>& action) { action(); };
  /// Runs a write of the optimizer's state with each split layer's state whole (gathered over the tp group, put
  /// back after), and a load of whole states followed by each split layer's slicing (the policy's
  /// `with_full_optimizer_state` and `load_full_optimizer_state`).
  std::function<void(torch::optim::Optimizer&, const std::function<void()>&)> with_whole_optimizer_state =
      [](torch::optim::Optimizer&, const std::function<void()>& action) { action(); };
  std::function<void(torch::optim::Optimizer&, const std::function<void()>&)> load_whole_optimizer_state =
      [](torch::optim::Optimizer&, const std::function<void()>& action) { action(); };
  /// The policies' scope around each stage's forward (bf16: autocast; tp: the split layers routed), held while it
  /// lives; and whether the last stage's floating output goes to the loss in float32, as a prepared model's does.
  std::function<std::shared_ptr<void>()> forward_scope{};
  bool float_output = false;
};

/// Two scopes held together.
template <class First, class Second>
struct scope_pair {
  First first;
  Second second;
};

/// The forward scopes of `acc`'s policies in `made`, around each stage (precision's autocast, the parallel policy's
/// routing of split layers), and the precision's output conversion.
template <class Accelerator>
void add_forward_scope(links& made, Accelerator& acc) {
  using precision = typename Accelerator::precision_type;
  static_assert(precision::mixed_precision() == "no" || precision::mixed_precision() == "bf16",
                "accel::pipeline runs its stages in fp32 or bf16: fp16's loss scaling and fp8's float8 layers do "
                "not compose with pipeline stages yet");
  made.forward_scope = [&acc] {
    using scopes = scope_pair<decltype(accelerator_access::parallel_forward_scope(acc)), decltype(acc.autocast())>;
    return std::shared_ptr<void>(new scopes{accelerator_access::parallel_forward_scope(acc), acc.autocast()});
  };
  made.float_output = precision::mixed_precision() == "bf16";
}

/// The dp_shard group's collectives in `made`.
template <class Group>
void add_shards(links& made, Group& group) {
  made.shards = group.size();
  made.shard_index = group.rank();
  made.all_gather_shards = [&group](at::Tensor& whole, at::Tensor& mine) { group.all_gather_into(whole, mine).wait(); };
  made.reduce_scatter_shards = [&group](at::Tensor& whole, at::Tensor& mine) {
    group.reduce_scatter_into(mine, whole).wait();
  };
}

struct linear_pass;  // pipeline.ipp: a Linear layer's forward, kept for zero bubble's weight pass

/// A message's shape and dtype, as its header gave them.
struct message_shape {
  std::vector<std::int64_t> sizes{};
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};

/// The links of `acc`'s process (see links); throws `accel::mesh_error` for a job the pipeline cannot run.
template <class Accelerator>
links links_of(Accelerator& acc) {
  if (acc.num_processes() == 1) {
    links alone;
    add_forward_scope(alone, acc);
    return alone;
  }
  const auto& mesh = acc.parallelism_config();
  if (!mesh || mesh->sizes().pp == 1)
    throw mesh_error("accel::pipeline: the job has " + std::to_string(acc.num_processes()) +
                     " processes but no pp dimension to place stages on; set options::parallelism_config.pp_size "
                     "(or accel launch --parallelism_config_pp_size)");
  const auto& sizes = mesh->sizes();
  if (sizes.cp > 1 || (sizes.tp > 1 && sizes.dp_shard > 1))
    throw mesh_error("accel::pipeline: the mesh " + describe(sizes) +
                     " puts cp, or tp and dp_shard together, beside pp, which the pipeline does not compose with yet; "
                     "use pp with dp_replicate and dp_shard, or with dp_replicate and tp");
  auto& parallel = accelerator_access::parallel(acc);
  if constexpr (!requires(at::Tensor& tensor) { parallel.communicator().send(tensor, 0, 0); }) {
    throw mesh_error("accel::pipeline: pp_size " + std::to_string(sizes.pp) +
                     " needs a policy over Gloo, data_parallel<gloo>, whose processes exchange the stages' messages");
  } else {
    auto& world = parallel.communicator();
    auto& stages = mesh_group(world, "pp", mesh->group_of("pp", world.rank()));
    links made{.rank = stages.rank(), .size = stages.size()};
    made.send = [&stages](at::Tensor& tensor, int peer, int tag) {
      return std::function<void()>([work = std::make_shared<decltype(stages.send(tensor, peer, tag))>(
                                        stages.send(tensor, peer, tag))] { work->wait(); });
    };
    made.receive = [&stages](at::Tensor& tensor, int peer, int tag) {
      return std::function<void()>([work = std::make_shared<decltype(stages.receive(tensor, peer, tag))>(
                                        stages.receive(tensor, peer, tag))] { work->wait(); });
    };
    made.broadcast = [&stages](at::Tensor& tensor, int root) { stages.broadcast(tensor, root); };
    if (mesh->has("dp")) {
      auto& data = mesh_group(world, "dp", mesh->group_of("dp", world.rank()));
      made.replicas = data.size();
      made.replica_index = data.rank();
    }
    if (sizes.dp_replicate > 1) {
      const std::string copies_of = sizes.dp_shard > 1 ? "dp_replicate" : "dp";
      auto& copies = mesh_group(world, copies_of, mesh->group_of(copies_of, world.rank()));
      made.sum_over_replicas = [&copies](at::Tensor& tensor) { copies.all_reduce(tensor, reduction::sum).wait(); };
    }
    if (sizes.dp_shard > 1) add_shards(made, mesh_group(world, "dp_shard", mesh->group_of("dp_shard", world.rank())));
    if (sizes.tp > 1) {
      made.tp = sizes.tp;
      made.tp_index = mesh->index_along("tp", world.rank());
      made.with_whole_layers = [&parallel](torch::nn::Module& module, const std::function<void()>& action) {
        parallel.with_full_parameters(module, action);
      };
      made.with_whole_optimizer_state = [&parallel](torch::optim::Optimizer& optimizer,
                                                    const std::function<void()>& action) {
        parallel.with_full_optimizer_state(optimizer, action);
      };
      made.load_whole_optimizer_state = [&parallel](torch::optim::Optimizer& optimizer,
                                                    const std::function<void()>& action) {
        parallel.load_full_optimizer_state(optimizer, action);
      };
    }
    add_forward_scope(made, acc);
    return made;
  }
}
}  // namespace accel::detail::pp
