/// \file
/// The device mesh of N-D parallelism, as Accelerate's `ParallelismConfig` builds it: sizes for dp_replicate,
/// dp_shard, cp and tp, and pp (pipeline stages, as torchtitan's mesh: accel/pipeline.hpp), the outermost; the
/// dimensions of size > 1 in the fixed order pp, dp_replicate, dp_shard, cp, tp; the flattened sub-meshes "dp"
/// (dp_replicate x dp_shard), "dp_shard_cp" (dp_shard x cp) and "dp_cp" (dp_replicate x dp_shard x cp) wherever one
/// of their parts is used. Ranks are laid out row-major over the mesh's shape, as PyTorch's `init_device_mesh`:
/// a dimension's groups are the ranks that vary along it while every other coordinate stays fixed.
///
///     accel::mesh_sizes sizes = accel::mesh_sizes_from_environment();  // PARALLELISM_CONFIG_*_SIZE
///     accel::mesh_layout layout(sizes, world_size);                     // validated as Accelerate's
///     layout.group_of("dp_shard", rank);                                // the ranks of this process's group
///
/// Sizes known when compiling are checked then: `accel::fixed_mesh<accel::mesh_sizes{.dp_shard = 2, .tp = 2}>`.
/// `accel::device_mesh<Communicator>` holds one process group per dimension and sub-mesh this process is in.
/// Plain C++ without LibTorch: the process groups come from the communicator it is given.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "detail/config.hpp"
#include "detail/support/text.hpp"
#include "launch.hpp"
#include "options.hpp"

namespace accel {

/// A mesh that cannot work; the message names the sizes and the fix.
struct mesh_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// The sizes of Accelerate's `ParallelismConfig` (its sequence parallelism, DeepSpeed's, has no counterpart). A size
/// of 1 leaves its dimension out of the mesh.
struct mesh_sizes {
  int dp_replicate = 1;  // data parallel, replicated (HSDP's replicas)
  int dp_shard = 1;      // data parallel, sharded (FSDP's shard group)
  int cp = 1;            // context parallel
  int tp = 1;            // tensor parallel
  int pp = 1;            // pipeline parallel: the mesh's outermost dimension, declared last so that sizes written
                         // in order ({2, 2, 1, 1}) keep their meaning

  /// The number of processes the mesh spans: Accelerate's `total_size`, in 64 bits (sizes of up to 2^31 each would
  /// wrap an int's product, 641 x 6700417 to 1); a product past 64 bits saturates at the largest value, which no
  /// job's number of processes equals.
  [[nodiscard]] constexpr std::int64_t total() const noexcept {
    std::int64_t product = 1;
    for (const int size : {dp_replicate, dp_shard, cp, tp, pp})
      if (__builtin_mul_overflow(product, size, &product)) return std::numeric_limits<std::int64_t>::max();
    return product;
  }
  friend constexpr bool operator==(const mesh_sizes&, const mesh_sizes&) = default;
};

namespace detail {

/// The sizes as a message writes them: "dp_replicate=2, dp_shard=2, cp=1, tp=1" (and ", pp=2" when pp > 1).
ACCEL_DECL std::string describe(const mesh_sizes& sizes);

/// Accelerate refuses tp or cp beside pure replication (dp_replicate > 1 with dp_shard == 1).
constexpr bool parallel_beside_pure_replication(const mesh_sizes& sizes) noexcept {
  return (sizes.tp > 1 || sizes.cp > 1) && sizes.dp_replicate > 1 && sizes.dp_shard == 1;
}

/// One size's variable, PARALLELISM_CONFIG_<NAME>_SIZE, its name as Accelerate's launch flag
/// (`--parallelism_config_<name>_size`) and key of the config file's `parallelism_config:` block, and its field in
/// the program's `options::parallelism_config`.
struct mesh_size_variable {
  std::string_view variable;
  std::string_view config_key;
  int mesh_sizes::* size;
  std::optional<int> parallelism_options::* given;
};

inline constexpr std::array<mesh_size_variable, 5> mesh_size_variables{{
    {"PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "parallelism_config_dp_replicate_size", &mesh_sizes::dp_replicate,
     &parallelism_options::dp_replicate_size},
    {"PARALLELISM_CONFIG_DP_SHARD_SIZE", "parallelism_config_dp_shard_size", &mesh_sizes::dp_shard,
     &parallelism_options::dp_shard_size},
    {"PARALLELISM_CONFIG_CP_SIZE", "parallelism_config_cp_size", &mesh_sizes::cp, &parallelism_options::cp_size},
    {"PARALLELISM_CONFIG_TP_SIZE", "parallelism_config_tp_size", &mesh_sizes::tp, &parallelism_options::tp_size},
    {"PARALLELISM_CONFIG_PP_SIZE", "parallelism_config_pp_size", &mesh_sizes::pp, &parallelism_options::pp_size},
}};

/// What Accelerate's launcher sets beside the sizes so that its Accelerator builds the mesh.
inline constexpr std::string_view use_parallelism_config_variable = "ACCELERATE_USE_PARALLELISM_CONFIG";

/// The names a rank query may use: the dimensions and the flattened sub-meshes.
inline constexpr std::array<std::string_view, 8> mesh_dimension_names{"pp", "dp_replicate", "dp_shard",    "cp",
                                                                      "tp", "dp",           "dp_shard_cp", "dp_cp"};

}  // namespace detail

/// Sizes fixed when compiling, checked then: each at least 1, and no tp or cp beside pure replication.
template <mesh_sizes Sizes>
struct fixed_mesh {
  static_assert(Sizes.dp_replicate >= 1, "accel::fixed_mesh: dp_replicate must be at least 1 (1: no replicas)");
  static_assert(Sizes.dp_shard >= 1, "accel::fixed_mesh: dp_shard must be at least 1 (1: no sharding)");
  static_assert(Sizes.cp >= 1, "accel::fixed_mesh: cp must be at least 1 (1: no context parallelism)");
  static_assert(Sizes.tp >= 1, "accel::fixed_mesh: tp must be at least 1 (1: no tensor parallelism)");
  static_assert(Sizes.pp >= 1, "accel::fixed_mesh: pp must be at least 1 (1: no pipeline stages)");
  static_assert(!detail::parallel_beside_pure_replication(Sizes),
                "accel::fixed_mesh: tp or cp beside pure replication (dp_replicate > 1, dp_shard == 1) is refused, "
                "as in Accelerate; set dp_shard > 1 (HSDP with tp/cp) or dp_replicate = 1 (FSDP with tp/cp)");
  static constexpr mesh_sizes sizes = Sizes;
};

/// The sizes from PARALLELISM_CONFIG_{DP_REPLICATE,DP_SHARD,CP,TP,PP}_SIZE; an unset (or empty) one is 1, as in
/// Accelerate. Throws `accel::mesh_error` naming the variable when one is not a whole number >= 1.
ACCEL_DECL mesh_sizes mesh_sizes_from_environment();

/// Whether the environment configures a mesh: ACCELERATE_USE_PARALLELISM_CONFIG when set (true or false, as
/// Accelerate's flags: 1/0, true/false, yes/no, on/off), otherwise whether any PARALLELISM_CONFIG_*_SIZE is set
/// (Accelerate would ignore the sizes without the flag, a trap its users report). `accel launch
/// --parallelism_config_*` sets both. Throws `accel::mesh_error` for a flag that is neither true nor false.
ACCEL_DECL bool parallelism_config_in_environment();

/// The sizes checked against a job of `num_processes`, as Accelerate's `ParallelismConfig` (`__post_init__`,
/// `_validate_accelerator`): every size at least 1; no tp or cp beside pure replication; all sizes 1 on several
/// processes means plain data parallelism (dp_replicate = the number of processes); otherwise the product must be
/// the number of processes. Throws `accel::mesh_error` naming the sizes and the fix.
ACCEL_DECL mesh_sizes validate_mesh(mesh_sizes sizes, int num_processes);

/// One dimension of the mesh, or a flattened sub-mesh: its name and the mesh axes it spans, in mesh order.
struct mesh_dimension {
  std::string name;
  std::vector<std::size_t> axes;
  friend bool operator==(const mesh_dimension&, const mesh_dimension&) = default;
};

/// Where every rank of a job sits in the mesh, and each dimension's groups: a pure function of the sizes and the
/// number of processes, the same on every process.
class mesh_layout {
 public:
  /// Validates `sizes` for `num_processes` (`validate_mesh`) and lays the ranks out row-major over the shape.
  ACCEL_DECL mesh_layout(const mesh_sizes& sizes, int num_processes);

  /// The sizes after validation (all 1 on several processes has become dp_replicate = the number of processes).
  [[nodiscard]] const mesh_sizes& sizes() const noexcept { return sizes_; }
  [[nodiscard]] int num_processes() const noexcept { return num_processes_; }
  /// The mesh's shape: the sizes > 1, in the order pp, dp_replicate, dp_shard, cp, tp (empty on one process).
  [[nodiscard]] const std::vector<int>& shape() const noexcept { return shape_; }
  /// The mesh's dimensions, then its flattened sub-meshes ("dp", "dp_shard_cp", "dp_cp" where they exist).
  [[nodiscard]] const std::vector<mesh_dimension>& dimensions() const noexcept { return dimensions_; }
  [[nodiscard]] bool has(std::string_view name) const noexcept { return find(name) != nullptr; }

  /// `rank`'s coordinate on each axis of `shape()`.
  [[nodiscard]] ACCEL_DECL std::vector<int> coordinates(int rank) const;

  /// The size of dimension `name`: the product of the axes it spans.
  [[nodiscard]] ACCEL_DECL int size(std::string_view name) const;

  /// `rank`'s index within its group of `name` (PyTorch's `mesh[name].get_local_rank()`).
  [[nodiscard]] ACCEL_DECL int local_rank(std::string_view name, int rank) const;

  /// `rank`'s index along `name` (one of `detail::mesh_dimension_names`), 0 where the mesh leaves that dimension out
  /// (size 1): Accelerate's rank queries (`tensor_parallel_rank` is `index_along("tp", rank)`).
  [[nodiscard]] ACCEL_DECL int index_along(std::string_view name, int rank) const;

  /// Whether several ranks read each batch: the tp, cp and pp peers of a data-parallel rank do.
  [[nodiscard]] bool batches_shared() const noexcept { return sizes_.tp * sizes_.cp * sizes_.pp > 1; }
  /// Whether `rank`'s results count for its batch in `gather_for_metrics`: of the peers that read it, the one first
  /// along tp and cp on the last pipeline stage (which holds a pipeline's outputs).
  [[nodiscard]] ACCEL_DECL bool counts_its_batch(int rank) const;

  /// The ranks of `rank`'s group of `name`, in group order: those differing from `rank` only on its axes.
  [[nodiscard]] ACCEL_DECL std::vector<int> group_of(std::string_view name, int rank) const;

  /// Every group of `name`, in the order of their first ranks: each rank is in exactly one.
  [[nodiscard]] ACCEL_DECL std::vector<std::vector<int>> groups(std::string_view name) const;

  /// Dimension `name`; throws `accel::mesh_error` listing the mesh's dimensions when it has none of that name.
  [[nodiscard]] ACCEL_DECL const mesh_dimension& dimension(std::string_view name) const;

 private:
  ACCEL_DECL const mesh_dimension* find(std::string_view name) const noexcept;

  /// A sub-mesh of the named axes that exist, as Accelerate's `_flatten` calls (none when none exists).
  ACCEL_DECL void flatten(std::string name, std::initializer_list<std::string_view> parts);

  [[nodiscard]] ACCEL_DECL int rank_at(const std::vector<int>& coordinates) const;

  ACCEL_DECL void check_rank(int rank) const;

  mesh_sizes sizes_;
  int num_processes_;
  std::vector<int> shape_;
  std::vector<mesh_dimension> dimensions_;
};

/// The mesh the environment configures for a job of `num_processes`, validated (`validate_mesh`), as Accelerate's
/// `Accelerator()` builds its `parallelism_config` from the variables; none where `parallelism_config_in_environment`
/// is false.
ACCEL_DECL std::optional<mesh_layout> parallelism_config_from_environment(int num_processes);

/// Context parallelism's rotation (accel/context_parallel.hpp): `given` where the program sets it, else
/// PARALLELISM_CONFIG_CP_COMM_STRATEGY ("allgather" or "alltoall", as Accelerate reads it; `accel launch
/// --parallelism_config_cp_comm_strategy` sets it), else all-gather. Throws `accel::mesh_error` naming another value.
[[nodiscard]] ACCEL_DECL cp_comm_strategy configured_cp_comm_strategy(const parallelism_options& given);

/// The mesh of Accelerate's `Accelerator(parallelism_config=...)` for a job of `num_processes`: each size the program
/// `given` sets, each other from its PARALLELISM_CONFIG_*_SIZE (as Accelerate reads its unset fields); where the
/// program sets none, the environment's (`parallelism_config_from_environment`). Validated (`validate_mesh`).
ACCEL_DECL std::optional<mesh_layout> configured_mesh(const parallelism_options& given, int num_processes);

namespace detail {

/// The group of `members` (this process among them), made once per process over the job's communicator and kept
/// for the process's life, as the job's process group is: a second mesh with the same group reuses it. Only the
/// members create it, each at the same point, through the job's rendezvous under a name that the members spell
/// alike.
template <class Communicator>
Communicator& mesh_group(Communicator& world, const std::string& name, const std::vector<int>& members) {
  static std::mutex guard;
  static auto* const made = new std::map<std::string, Communicator*>();
  std::string key = "accel/mesh/" + name + "/";
  std::string ranks;
  for (int member : members) append_item(ranks, std::to_string(member), ",");
  key += ranks;
  std::lock_guard lock(guard);
  auto& group = (*made)[key];
  if (group == nullptr) group = world.subgroup(key, members).release();
  return *group;
}

}  // namespace detail

/// The mesh of one process of the job: its layout, and a process group (a communicator of `Communicator`'s kind)
/// for each dimension and flattened sub-mesh, over the members of this process's group only. Every process of the
/// job constructs it with the same sizes, at the same point.
template <class Communicator>
class device_mesh {
 public:
  /// `world` is the job's communicator (its rank and size are this process's and the job's).
  device_mesh(const mesh_sizes& sizes, Communicator& world) : layout_(sizes, world.size()), rank_(world.rank()) {
    for (const auto& dimension : layout_.dimensions())
      groups_.emplace(dimension.name,
                      &detail::mesh_group(world, dimension.name, layout_.group_of(dimension.name, rank_)));
  }

  [[nodiscard]] const mesh_layout& layout() const noexcept { return layout_; }
  /// This process's coordinate on each axis of the mesh's shape.
  [[nodiscard]] std::vector<int> coordinates() const { return layout_.coordinates(rank_); }
  /// This process's index within its group of `name`.
  [[nodiscard]] int local_rank(std::string_view name) const { return layout_.local_rank(name, rank_); }
  /// The ranks of this process's group of `name`.
  [[nodiscard]] std::vector<int> members(std::string_view name) const { return layout_.group_of(name, rank_); }
  /// The process group of `name`; throws `accel::mesh_error` naming the mesh's dimensions for an unknown name.
  [[nodiscard]] Communicator& group(std::string_view name) const { return *groups_.at(layout_.dimension(name).name); }

 private:
  mesh_layout layout_;
  int rank_;
  std::map<std::string, Communicator*, std::less<>> groups_;
};

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/device_mesh.ipp"
#endif
