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
///
/// `hybrid_sharded_tensor_parallel` adds dp_replicate (3-D: Accelerate's `ParallelismConfig(dp_replicate_size=R,
/// dp_shard_size=S, tp_size=T)`): the same within each dp_shard group, each reduced gradient segment then all-reduced
/// across dp_replicate, as `accel::hybrid_sharded` does.
#pragma once

#include "detail/config.hpp"
#include "hybrid_sharded.hpp"
#include "tensor_parallel.hpp"

#if ACCEL_HAS_LINEAR_ROUTING
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace accel {
namespace detail::tp {

/// Whether a policy sharding beside tensor parallelism replicates its shards across the "dp_replicate" group (HSDP).
enum class shard_replicas { none, across_dp_replicate };

/// `mesh` (checked for tensor parallelism already) checked for sharding beside it: dp_shard above 1, and dp_replicate
/// above 1 exactly when the policy replicates its shards. Throws `accel::mesh_error` naming the sizes and the fix.
ACCEL_DECL void check_sharded_beside_tp(const mesh_layout& mesh, std::string_view policy_name, shard_replicas replicas);

/// What `fully_sharded_tensor_parallel` and `hybrid_sharded_tensor_parallel` share: tensor parallelism beside
/// `fully_sharded` narrowed to the "dp_shard" group, its shard units gathering on a group of their own, and (on a
/// mesh with dp_replicate, which the hybrid policy requires and the other refuses) each reduced gradient segment
/// all-reduced across the "dp_replicate" group, as `hybrid_sharded` does.
template <class Backend>
struct sharded_beside_tp : tensor_parallel_beside<fully_sharded<Backend>> {
  sharded_beside_tp(const options& opts, std::string_view policy, shard_replicas replicas)
      : tensor_parallel_beside<fully_sharded<Backend>>(opts, policy), policy_(policy) {
    const auto& mesh = this->mesh();
    check_sharded_beside_tp(mesh.layout(), policy, replicas);
    if (opts.sharding.state_dict != state_dict_type::full)
      throw std::invalid_argument(std::string(policy) +
                                  ": options::sharding.state_dict = sharded writes each process's flat shards, which "
                                  "here are shards of tp slices; leave it at state_dict_type::full (whole weights, "
                                  "which load under any mesh or on one process)");
    // With cp, the shards span dp_shard x cp (PyTorch's FSDP on the flattened dp_shard_cp): the cp peers, which read
    // other tokens, hold other shards and average their gradients too.
    auto& shard_group = mesh.group(mesh.layout().sizes().cp > 1 ? "dp_shard_cp" : "dp_shard");
    this->narrow_to(shard_group);
    if (replicas == shard_replicas::across_dp_replicate) this->replicate_gradients_across(mesh.group("dp_replicate"));
    this->gather_units_on(detail::separate_group_of(shard_group, "accel/fsdp_tp/unit_gathers"));
  }

  /// Checkpoints hold whole weights: `load_state` reads them into the full parameters and each process keeps its
  /// slice of its tp slice (fully_sharded's slices of a checkpoint's tensors would be of the whole, not of the tp
  /// slice).
  static constexpr bool keeps_parameter_slices = false;
  /// Not yet: `accel::construct_sharded` builds a whole model's slices, not a tp slice's.
  static constexpr bool takes_constructed_slices = false;
  /// None: the sharded checkpoint format is refused (a flat shard of a tp slice is no slice of the whole).
  [[nodiscard]] static std::optional<parameter_shard> shard_of(const at::Tensor&) { return std::nullopt; }

  /// At prepare, fp8's float8 all-gather (`enable_fsdp_float8_all_gather`) is refused: it would scale each weight
  /// by its tp slice's amax, where the split layers cast with the whole weight's.
  void use_gather_encoding(std::shared_ptr<parameter_encoding> encoding) {
    if (encoding != nullptr)
      throw std::invalid_argument(policy_ +
                                  ": options::fp8.enable_fsdp_float8_all_gather is not built beside tensor "
                                  "parallelism (it would scale each weight by its tp slice's amax); leave it false: "
                                  "the weights are then gathered in their own type and still computed in float8");
  }

 private:
  std::string policy_;
};

}  // namespace detail::tp

/// Tensor parallelism over `Backend` on the "tp" group with `fully_sharded` over the "dp_shard" group (tp and dp_shard
/// above 1, no dp_replicate or cp). The processes, the data (divided by the dp rank: the tp peers read the same
/// batches) and every query and collective are the whole job's. Every process of the job constructs it at the same
/// point (it makes the mesh's groups).
template <class Backend>
struct fully_sharded_tensor_parallel : detail::tp::sharded_beside_tp<Backend> {
  explicit fully_sharded_tensor_parallel(const options& opts)
      : detail::tp::sharded_beside_tp<Backend>(opts, "accel::fully_sharded_tensor_parallel",
                                               detail::tp::shard_replicas::none) {}

  [[nodiscard]] static std::string name() {
    return "fully_sharded_tensor_parallel<" + std::string(Backend::name) + ">";
  }
};

/// 3-D parallelism (Accelerate's `ParallelismConfig(dp_replicate_size=R, dp_shard_size=S, tp_size=T)`, FSDP2's HSDP
/// `fully_shard(mesh=mesh["dp_replicate", "dp_shard"])` over a model `parallelize_module` split on `mesh["tp"]`):
/// `fully_sharded_tensor_parallel` within each dp_shard group, its shards replicated across the dp_replicate groups
/// as `hybrid_sharded` replicates them (each gradient bucket reduce-scattered within dp_shard, then its reduced
/// segment all-reduced across dp_replicate). Each process holds 1/S of its tp rank's state.
///
///     // accel launch --nproc_per_node 8 --parallelism_config_dp_replicate_size 2
///     //   --parallelism_config_dp_shard_size 2 --parallelism_config_tp_size 2
///     accel::accelerator<accel::bf16, accel::hybrid_sharded_tensor_parallel<accel::gloo>> acc;
///     accel::parallelize_module(acc, model, plan);  // then the optimizer, then prepare, as under tensor_parallel
template <class Backend>
struct hybrid_sharded_tensor_parallel : detail::tp::sharded_beside_tp<Backend> {
  explicit hybrid_sharded_tensor_parallel(const options& opts)
      : detail::tp::sharded_beside_tp<Backend>(opts, "accel::hybrid_sharded_tensor_parallel",
                                               detail::tp::shard_replicas::across_dp_replicate) {}

  [[nodiscard]] static std::string name() {
    return "hybrid_sharded_tensor_parallel<" + std::string(Backend::name) + ">";
  }
};

}  // namespace accel

#else  // a LibTorch without the routing key

namespace accel {
/// Refused at compile time, as `accel::tensor_parallel` is.
template <class Backend>
struct fully_sharded_tensor_parallel : tensor_parallel<Backend> {};
template <class Backend>
struct hybrid_sharded_tensor_parallel : tensor_parallel<Backend> {};
}  // namespace accel

#endif  // ACCEL_HAS_LINEAR_ROUTING

#if ACCEL_HEADER_ONLY
#include "impl/fully_sharded_tensor_parallel.ipp"
#endif
