/// \file
/// Fully sharded data parallelism beside tensor parallelism (2-D: Accelerate's `ParallelismConfig(dp_shard_size=D,
/// tp_size=T)`, FSDP2's `fully_shard(mesh=mesh["dp_shard"])` over a model `parallelize_module` split on
/// `mesh["tp"]`): the layers a plan names split across the "tp" group as under `accel::tensor_parallel`, and their
/// tp slices (every parameter, its gradient and its optimizer state) sharded across the "dp_shard" group as
/// `accel::fully_sharded` shards a whole model, with its shard units. Each process then holds 1/D of its tp rank's
/// state: the bytes of FSDP, where `tensor_parallel` holds DDP's.
///
///     // accel launch --nproc_per_node 4 --parallelism_config_dp_shard_size 2 --parallelism_config_tp_size 2
///     accel::accelerator<accel::fp32, accel::fully_sharded_tensor_parallel<accel::gloo>> acc;
///     accel::parallelize_module(acc, model, plan);  // then the optimizer, then prepare, as under tensor_parallel
///
/// Per step: the tp all-reduces of tensor_parallel, unchanged; within the dp_shard group, the parameters
/// all-gathered before the forward (per unit with shard units) and each gradient bucket reduce-scattered. Checkpoints
/// hold whole weights and optimizer state (gathered over dp_shard, then over tp), so they load under any tp size or
/// on one process.
#pragma once

#include "hybrid_sharded.hpp"
#include "tensor_parallel.hpp"

#if ACCEL_HAS_LINEAR_ROUTING
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace accel {
namespace detail::tp {

/// `mesh` (checked for tensor parallelism already) checked for sharding beside it: dp_shard above 1, no
/// dp_replicate. Throws `accel::mesh_error` naming the sizes and the fix.
inline void check_sharded_beside_tp(const mesh_layout& mesh) {
  const std::string policy = "accel::fully_sharded_tensor_parallel: ";
  const auto& sizes = mesh.sizes();
  if (sizes.dp_shard < 2)
    throw mesh_error(policy + "the mesh " + describe(sizes) +
                     " has no dp_shard dimension to shard over (dp_shard must be above 1): start it with accel "
                     "launch --parallelism_config_dp_shard_size D --parallelism_config_tp_size T (D x T = the "
                     "processes); without dp_shard use accel::tensor_parallel");
  if (sizes.dp_replicate > 1)
    throw mesh_error(policy + "the mesh " + describe(sizes) +
                     " has dp_replicate above 1; sharding beside tensor parallelism is built over dp_shard alone: "
                     "set dp_replicate to 1 (fold it into dp_shard), or use accel::tensor_parallel, which replicates "
                     "over dp_replicate x dp_shard");
}

}  // namespace detail::tp

/// Tensor parallelism over `Backend` on the "tp" group with `fully_sharded` over the "dp_shard" group (tp and dp_shard
/// above 1, no dp_replicate or cp). The processes, the data (divided by the dp_shard rank: the tp peers read the same
/// batches) and every query and collective are the whole job's. Every process of the job constructs it at the same
/// point (it makes the mesh's groups).
template <class Backend>
struct fully_sharded_tensor_parallel : detail::tp::tensor_parallel_beside<fully_sharded<Backend>> {
  explicit fully_sharded_tensor_parallel(const options& opts)
      : detail::tp::tensor_parallel_beside<fully_sharded<Backend>>(opts, "accel::fully_sharded_tensor_parallel") {
    detail::tp::check_sharded_beside_tp(this->mesh().layout());
    if (opts.sharding.state_dict != state_dict_type::full)
      throw std::invalid_argument(
          "accel::fully_sharded_tensor_parallel: options::sharding.state_dict = sharded writes each process's flat "
          "shards, which here are shards of tp slices; leave it at state_dict_type::full (whole weights, which load "
          "under any tp size or on one process)");
    auto& shard_group = this->mesh().group("dp_shard");
    this->narrow_to(shard_group);
    this->gather_units_on(detail::separate_group_of(shard_group, "accel/fsdp_tp/unit_gathers"));
  }

  [[nodiscard]] static std::string name() {
    return "fully_sharded_tensor_parallel<" + std::string(Backend::name) + ">";
  }

  /// Checkpoints hold whole weights: `load_state` reads them into the full parameters and each process keeps its
  /// slice of its tp slice (fully_sharded's slices of a checkpoint's tensors would be of the whole, not of the tp
  /// slice).
  static constexpr bool keeps_parameter_slices = false;
  /// Not yet: `accel::construct_sharded` builds a whole model's slices, not a tp slice's.
  static constexpr bool takes_constructed_slices = false;
  /// None: the sharded checkpoint format is refused (a flat shard of a tp slice is no slice of the whole).
  [[nodiscard]] static std::optional<parameter_shard> shard_of(const at::Tensor&) { return std::nullopt; }
};

}  // namespace accel

#else  // a LibTorch without the routing key

namespace accel {
/// Refused at compile time, as `accel::tensor_parallel` is.
template <class Backend>
struct fully_sharded_tensor_parallel : tensor_parallel<Backend> {};
}  // namespace accel

#endif  // ACCEL_HAS_LINEAR_ROUTING
