/// \file
/// Hybrid sharded data parallelism (HSDP: PyTorch FSDP's `HYBRID_SHARD`, FSDP2's `fully_shard` on a 2-D mesh,
/// Accelerate's `ParallelismConfig(dp_replicate_size=R, dp_shard_size=S)`): `accel::fully_sharded` within each
/// dp_shard group of the device mesh (device_mesh.hpp), the S groups' shards replicated across the dp_replicate
/// groups. Parameters, gradients and optimizer state are sharded S ways, not P = R x S ways; the parameters are
/// all-gathered within the shard group only (intra-node traffic, where the shard group is a machine), and each
/// gradient bucket is reduce-scattered within the shard group, then its reduced segment all-reduced across the R
/// replicas, so that every process steps the whole job's average gradient.
///
///     // accel launch --nproc_per_node 4 --parallelism_config_dp_replicate_size 2 --parallelism_config_dp_shard_size 2
///     accel::accelerator<accel::bf16, accel::hybrid_sharded<accel::gloo>> acc;
///
/// The processes, the data and every query (`process_index`, `num_processes`, the collectives of
/// accel/collectives.hpp) are the whole job's, as under `fully_sharded`; only the sharding is the shard group's.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "detail/config.hpp"
#include "device_mesh.hpp"
#include "sharded_data_parallel.hpp"

namespace accel {
namespace detail {

/// `mesh` (the job's `ParallelismConfig`, none when nothing configures one) checked for hybrid sharding on
/// `num_processes`: dp_replicate and dp_shard both above 1, no tp (cp beside: the shards span dp_shard x cp). Throws
/// `accel::mesh_error` naming the sizes and the fix.
ACCEL_DECL const mesh_layout& hybrid_sharding_mesh(const std::optional<mesh_layout>& mesh, int num_processes);

/// A group of the same processes as `group`, its collectives ordered apart from `group`'s (the shard units gather
/// on it while the reducer reduce-scatters), made once per group for the process's life; every member makes it at
/// the same point.
template <class Communicator>
auto& separate_group_of(Communicator& group, const std::string& name) {
  using separate_type = std::remove_reference_t<decltype(*group.separate(name))>;
  static auto* const made = new std::map<const Communicator*, separate_type*>();
  auto& separate = (*made)[&group];
  if (separate == nullptr) separate = group.separate(name).release();
  return *separate;
}

}  // namespace detail

/// Hybrid sharding over `Backend` on the mesh of the job's `ParallelismConfig`: `fully_sharded` given the dp_shard
/// group as its process group, and the dp_replicate group as the replicas its gradient reducer all-reduces across.
/// Every process of the job constructs it at the same point (it makes the mesh's groups, once per process).
template <class Backend>
struct hybrid_sharded : fully_sharded<Backend> {
  using base = fully_sharded<Backend>;
  using typename base::communicator_type;

  explicit hybrid_sharded(const options& opts)
      : base(opts),
        world_(&base::communicator()),
        mesh_(detail::hybrid_sharding_mesh(configured_mesh(opts.parallelism_config, world_->size()), world_->size())
                  .sizes(),
              *world_) {
    if (opts.sharding.state_dict != state_dict_type::full)
      throw std::invalid_argument(
          "accel::hybrid_sharded: options::sharding.state_dict = sharded writes one file per process's shards, "
          "which hybrid sharding replicates; leave it at state_dict_type::full (a full checkpoint loads on any mesh)");
    // With cp, the shards span dp_shard x cp (PyTorch's FSDP on the flattened dp_shard_cp).
    auto& shard_group = mesh_.group(mesh_.layout().sizes().cp > 1 ? "dp_shard_cp" : "dp_shard");
    this->narrow_to(shard_group);
    this->replicate_gradients_across(mesh_.group("dp_replicate"));
    this->gather_units_on(detail::separate_group_of(shard_group, "accel/hsdp/unit_gathers"));
  }

  [[nodiscard]] static std::string name() { return "hybrid_sharded<" + std::string(Backend::name) + ">"; }
  /// FSDP with `HYBRID_SHARD` in Accelerate.
  [[nodiscard]] static constexpr std::string_view distributed_type() noexcept { return "FSDP"; }

  // The job's processes and collectives, not the shard group's (which the sharding inherited from fully_sharded
  // uses): the data loader, the main process and accel/collectives.hpp span every process.
  [[nodiscard]] int process_index() const noexcept { return world_->rank(); }
  [[nodiscard]] int local_process_index() const noexcept { return world_->environment().local_rank; }
  [[nodiscard]] int num_processes() const noexcept { return world_->size(); }
  void wait_for_everyone() { world_->barrier(); }
  [[nodiscard]] communicator_type& communicator() noexcept { return *world_; }

  /// The mesh: its layout and this process's groups.
  [[nodiscard]] const device_mesh<communicator_type>& mesh() const noexcept { return mesh_; }

  /// Checks that every process of the job prepared the same model and gives all of them process 0's (the shard
  /// group's broadcast alone would leave the replicas apart), then prepares it as `fully_sharded`. What
  /// construct_sharded built sliced is not broadcast: every process built the same initialisation and kept its
  /// dp_shard slice, the same in every replica.
  void prepare_model(torch::nn::Module& module) {
    detail::check_same_module(module, *world_);
    this->prepare_model_after(module, [&](const std::function<bool(const at::Tensor&)>& built_sliced) {
      detail::broadcast_module_state(module, *world_, 0, built_sliced);
    });
  }

 private:
  communicator_type* world_;
  device_mesh<communicator_type> mesh_;
};

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/hybrid_sharded.ipp"
#endif
