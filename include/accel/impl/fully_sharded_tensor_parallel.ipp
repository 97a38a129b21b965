/// \file
/// What fully_sharded_tensor_parallel.hpp declares and does not define: included by it in header-only mode, compiled
/// once into accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../fully_sharded_tensor_parallel.hpp"

#if ACCEL_HAS_LINEAR_ROUTING

namespace accel::detail::tp {

void check_sharded_beside_tp(const mesh_layout& mesh, std::string_view policy_name, shard_replicas replicas) {
  const bool hybrid = replicas == shard_replicas::across_dp_replicate;
  const std::string policy = std::string(policy_name) + ": ";
  const auto& sizes = mesh.sizes();
  if (sizes.dp_shard * sizes.cp < 2)
    throw mesh_error(policy + "the mesh " + describe(sizes) +
                     " has no dp_shard or cp dimension to shard over (one must be above 1): start it with accel "
                     "launch --parallelism_config_dp_shard_size D --parallelism_config_tp_size T (D x T = the "
                     "processes, times dp_replicate); without dp_shard use accel::tensor_parallel");
  if (!hybrid && sizes.dp_replicate > 1)
    throw mesh_error(policy + "the mesh " + describe(sizes) +
                     " has dp_replicate above 1, across which this policy does not replicate its shards: use "
                     "accel::hybrid_sharded_tensor_parallel (HSDP beside tp), or set dp_replicate to 1");
  if (hybrid && sizes.dp_replicate < 2)
    throw mesh_error(policy + "the mesh " + describe(sizes) +
                     " has no dp_replicate dimension to replicate the shards across (dp_replicate must be above 1): "
                     "start it with accel launch --parallelism_config_dp_replicate_size R; with dp_replicate = 1 use "
                     "accel::fully_sharded_tensor_parallel");
}

}  // namespace accel::detail::tp

#endif  // ACCEL_HAS_LINEAR_ROUTING
