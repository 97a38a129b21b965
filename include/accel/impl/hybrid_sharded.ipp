/// \file
/// What hybrid_sharded.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../hybrid_sharded.hpp"

namespace accel::detail {

const mesh_layout& hybrid_sharding_mesh(const std::optional<mesh_layout>& mesh, int num_processes) {
  const std::string policy = "accel::hybrid_sharded: ";
  if (!mesh)
    throw mesh_error(policy + "no device mesh is configured for this job of " + std::to_string(num_processes) +
                     " processes; hybrid sharding needs dp_replicate x dp_shard = " + std::to_string(num_processes) +
                     ": start it with accel launch --parallelism_config_dp_replicate_size R "
                     "--parallelism_config_dp_shard_size S, or set PARALLELISM_CONFIG_DP_REPLICATE_SIZE and "
                     "PARALLELISM_CONFIG_DP_SHARD_SIZE");
  const auto& sizes = mesh->sizes();
  if (sizes.tp > 1)
    throw mesh_error(policy + "the mesh " + describe(sizes) +
                     " has tp; hybrid sharding spans dp_replicate x dp_shard (x cp): set tp to 1, or use "
                     "accel::hybrid_sharded_tensor_parallel");
  if (sizes.dp_replicate < 2 || sizes.dp_shard < 2)
    throw mesh_error(policy + "the mesh " + describe(sizes) +
                     " lacks a dimension: hybrid sharding shards within dp_shard and replicates across "
                     "dp_replicate, both above 1 (for example dp_replicate=2, dp_shard=" +
                     std::to_string(num_processes / 2) + " on " + std::to_string(num_processes) +
                     " processes); with dp_replicate=1 use accel::fully_sharded, with dp_shard=1 accel::data_parallel");
  return *mesh;
}

}  // namespace accel::detail
