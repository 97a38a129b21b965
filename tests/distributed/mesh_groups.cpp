// mesh.gloo.P4.groups: on 4 Gloo processes, each device mesh's process groups (accel/device_mesh.hpp) sum exactly
// over their members: rank r contributes 2^r, so every sum names the ranks that took part. A second mesh of the same
// sizes reuses the groups (made once). Exits non-zero, naming the mesh and the dimension, on any difference.
// With the argument "ranks" (mesh.launch.ranks, under `accel launch --parallelism_config_*`): prints the rank queries
// of an accelerator made in the mesh the launcher configured, one JSON line; check_mesh_layout.py compares them with
// PyTorch's init_device_mesh.
#include <accel/accelerator.hpp>
#include <accel/device_mesh.hpp>
#include <accel/parallel.hpp>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace {

using communicator = accel::detail::gloo_communicator;

/// Checks every group of `mesh` on this process; returns the number of failures.
int check_groups(const accel::device_mesh<communicator>& mesh, int rank) {
  int failures = 0;
  for (const auto& dimension : mesh.layout().dimensions()) {
    auto& group = mesh.group(dimension.name);
    const auto members = mesh.members(dimension.name);
    auto value = at::full({3}, std::int64_t{1} << rank, at::kLong);
    group.all_reduce(value, accel::reduction::sum).wait();
    std::int64_t expected = 0;
    for (int member : members) expected += std::int64_t{1} << member;
    const bool ok = value.eq(expected).all().item<bool>() && group.size() == static_cast<int>(members.size()) &&
                    group.rank() == mesh.local_rank(dimension.name);
    if (!ok) {
      std::cerr << "rank " << rank << ", mesh " << accel::detail::describe(mesh.layout().sizes()) << ", "
                << dimension.name << ": sum " << value[0].item<std::int64_t>() << ", expected " << expected
                << "; group rank " << group.rank() << " of " << group.size() << "\n";
      ++failures;
    }
  }
  return failures;
}

/// The accelerator's mesh and rank queries on this process, as one JSON line.
int print_ranks() {
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc{{.cpu = true}};
  if (!acc.parallelism_config()) {
    std::cerr << "mesh_groups ranks: no parallelism config; start it with accel launch --parallelism_config_*\n";
    return 2;
  }
  const auto& sizes = acc.parallelism_config()->sizes();
  std::cout << "{\"rank\": " << acc.process_index() << ", \"sizes\": [" << sizes.dp_replicate << ", " << sizes.dp_shard
            << ", " << sizes.cp << ", " << sizes.tp << "], \"data_parallel_rank\": " << acc.data_parallel_rank()
            << ", \"data_parallel_shard_rank\": " << acc.data_parallel_shard_rank()
            << ", \"tensor_parallel_rank\": " << acc.tensor_parallel_rank()
            << ", \"context_parallel_rank\": " << acc.context_parallel_rank() << ", \"cp_comm_strategy\": \""
            << (accel::configured_cp_comm_strategy(acc.options().parallelism_config) ==
                        accel::cp_comm_strategy::alltoall
                    ? "alltoall"
                    : "allgather")
            << "\"}" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "ranks") return print_ranks();
  auto& world = accel::detail::process_group<communicator>(std::chrono::seconds(60));
  if (world.size() != 4) {
    std::cerr << "mesh_groups runs on 4 processes (accel launch --nproc_per_node 4), not " << world.size() << "\n";
    return 2;
  }
  const std::vector<accel::mesh_sizes> meshes = {
      {.dp_replicate = 2, .dp_shard = 2}, {.dp_shard = 2, .tp = 2}, {.cp = 2, .tp = 2}, {.dp_shard = 4}, {}};
  int failures = 0;
  int checked = 0;
  for (const auto& sizes : meshes) {
    const accel::device_mesh<communicator> mesh(sizes, world);
    failures += check_groups(mesh, world.rank());
    checked += static_cast<int>(mesh.layout().dimensions().size());
  }
  // The same sizes again: the same process groups, not new ones.
  const accel::device_mesh<communicator> first(meshes[0], world);
  const accel::device_mesh<communicator> again(meshes[0], world);
  for (const auto& dimension : first.layout().dimensions())
    if (&first.group(dimension.name) != &again.group(dimension.name)) {
      std::cerr << "rank " << world.rank() << ": a second 2x2 mesh made a new group for " << dimension.name << "\n";
      ++failures;
    }
  failures += check_groups(again, world.rank());
  world.barrier();
  if (world.rank() == 0 && failures == 0)
    std::cout << "mesh groups: " << checked << " dimensions over " << meshes.size() << " meshes sum exactly\n";
  return failures == 0 ? 0 : 1;
}
