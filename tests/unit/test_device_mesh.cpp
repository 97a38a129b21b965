// The device mesh's sizes, validation and layout (accel/device_mesh.hpp), without processes: what each refusal says,
// the variables, and the layout's invariants. check_mesh_layout.py compares the layout itself with PyTorch's.
#include <accel/device_mesh.hpp>
#include <catch2/catch.hpp>

#include "scoped_variable.hpp"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace {

using accel_test::scoped_variable;

std::string refusal(const accel::mesh_sizes& sizes, int num_processes) {
  try {
    (void)accel::validate_mesh(sizes, num_processes);
  } catch (const accel::mesh_error& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("sizes fixed when compiling are the sizes", "[mesh]") {
  constexpr auto sizes = accel::fixed_mesh<accel::mesh_sizes{.dp_replicate = 2, .dp_shard = 2, .tp = 2}>::sizes;
  STATIC_REQUIRE(sizes == accel::mesh_sizes{2, 2, 1, 2});
  STATIC_REQUIRE(sizes.total() == 8);
  const accel::mesh_layout layout(sizes, 8);
  CHECK(layout.shape() == std::vector<int>{2, 2, 2});
}

TEST_CASE("validation refuses as Accelerate, naming the sizes and the fix", "[mesh]") {
  CHECK(refusal({.dp_shard = 0}, 1) ==
        "accel: mesh dp_replicate=1, dp_shard=0, cp=1, tp=1: every size must be at least 1 (1: the dimension is not "
        "used); fix PARALLELISM_CONFIG_DP_SHARD_SIZE or the size given in the program");
  CHECK(refusal({.tp = -2}, 2).find("fix PARALLELISM_CONFIG_TP_SIZE") != std::string::npos);
  CHECK(refusal({.dp_replicate = 2, .tp = 2}, 4) ==
        "accel: mesh dp_replicate=2, dp_shard=1, cp=1, tp=2: tp or cp beside pure replication (dp_replicate > 1, "
        "dp_shard == 1) is refused, as in Accelerate; set dp_shard > 1 (HSDP with tp/cp) or dp_replicate = 1 (FSDP "
        "with tp/cp)");
  CHECK(refusal({.dp_replicate = 2, .cp = 2}, 4).find("tp or cp beside pure replication") != std::string::npos);
  CHECK(refusal({.dp_replicate = 2, .dp_shard = 2}, 8) ==
        "accel: mesh dp_replicate=2, dp_shard=2, cp=1, tp=1 spans 4 processes (Accelerate's total_size) but the job "
        "has 8; make their product equal the number of processes (here dp_replicate = 8 / (dp_shard x cp x tp) = 4), "
        "or start 4 processes");
  // No suggestion where it does not divide, or where it would put tp beside pure replication.
  CHECK(refusal({.dp_shard = 3}, 8) ==
        "accel: mesh dp_replicate=1, dp_shard=3, cp=1, tp=1 spans 3 processes (Accelerate's total_size) but the job "
        "has 8; make their product equal the number of processes, or start 3 processes");
  CHECK(refusal({.tp = 2}, 8).find("processes, or start 2") != std::string::npos);
  CHECK(refusal({.dp_shard = 2, .tp = 2}, 4) == "accepted");
}

TEST_CASE("all sizes 1 on several processes is plain data parallelism, and one process has no mesh", "[mesh]") {
  CHECK(accel::validate_mesh({}, 4) == accel::mesh_sizes{4, 1, 1, 1});
  const accel::mesh_layout one({}, 1);
  CHECK(one.shape().empty());
  CHECK(one.dimensions().empty());
  CHECK(one.coordinates(0).empty());
  CHECK_THROWS_WITH(one.group_of("dp", 0),
                    "accel: the mesh (dp_replicate=1, dp_shard=1, cp=1, tp=1) has no dimension "
                    "\"dp\"; it has none (one process). A dimension of size 1 is left out: "
                    "give it a size > 1 to use it");
}

TEST_CASE("the dimensions: sizes > 1 in Accelerate's order, then the flattened sub-meshes", "[mesh]") {
  const accel::mesh_layout layout({.dp_replicate = 2, .dp_shard = 2, .cp = 2, .tp = 2}, 16);
  std::vector<std::string> names;
  for (const auto& dimension : layout.dimensions()) names.push_back(dimension.name);
  CHECK(names == std::vector<std::string>{"dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp"});
  CHECK(layout.dimension("dp_shard_cp").axes == std::vector<std::size_t>{1, 2});
  CHECK(layout.size("dp_cp") == 8);
  CHECK(layout.group_of("dp_shard_cp", 5) == std::vector<int>{1, 3, 5, 7});
  CHECK(layout.local_rank("dp_shard_cp", 5) == 2);
  const accel::mesh_layout tp_only({.tp = 4}, 4);
  CHECK(tp_only.has("tp"));
  CHECK_FALSE(tp_only.has("dp"));
  CHECK_THROWS_WITH(tp_only.size("dp_shard"), Catch::Contains("it has tp. A dimension of size 1 is left out"));
  CHECK_THROWS_WITH(tp_only.coordinates(4), "accel: rank 4 is not in the mesh's job of 4 processes (ranks 0 to 3)");
}

TEST_CASE("each dimension's groups partition the ranks, and a rank's index is its place in its group", "[mesh]") {
  const accel::mesh_layout layout({.dp_replicate = 2, .dp_shard = 3, .tp = 2}, 12);
  for (const auto& dimension : layout.dimensions()) {
    const auto groups = layout.groups(dimension.name);
    CHECK(groups.size() * static_cast<std::size_t>(layout.size(dimension.name)) == 12);
    std::vector<int> seen;
    for (const auto& group : groups) {
      CHECK(std::is_sorted(group.begin(), group.end()));
      for (std::size_t i = 0; i < group.size(); ++i) {
        CHECK(layout.group_of(dimension.name, group[i]) == group);
        CHECK(layout.local_rank(dimension.name, group[i]) == static_cast<int>(i));
        seen.push_back(group[i]);
      }
    }
    std::sort(seen.begin(), seen.end());
    for (int rank = 0; rank < 12; ++rank) CHECK(seen[static_cast<std::size_t>(rank)] == rank);
  }
  CHECK(layout.groups("tp") == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}});
  CHECK(layout.groups("dp_replicate").front() == std::vector<int>{0, 6});
  CHECK(layout.groups("dp").front() == std::vector<int>{0, 2, 4, 6, 8, 10});
  CHECK(layout.coordinates(11) == std::vector<int>{1, 2, 1});
}

TEST_CASE("the sizes from PARALLELISM_CONFIG_*_SIZE", "[mesh]") {
  scoped_variable replicate("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "2");
  scoped_variable shard("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4");
  scoped_variable cp("PARALLELISM_CONFIG_CP_SIZE", "");  // empty: unset, as the other ACCELERATE_* variables
  scoped_variable tp("PARALLELISM_CONFIG_TP_SIZE", nullptr);
  CHECK(accel::mesh_sizes_from_environment() == accel::mesh_sizes{2, 4, 1, 1});
  {
    scoped_variable bad("PARALLELISM_CONFIG_TP_SIZE", "2x");
    CHECK_THROWS_WITH(accel::mesh_sizes_from_environment(),
                      "accel: PARALLELISM_CONFIG_TP_SIZE=\"2x\" is not a whole number >= 1; set it to the "
                      "dimension's size, or unset it (1: the dimension is not used)");
  }
  scoped_variable zero("PARALLELISM_CONFIG_CP_SIZE", "0");
  CHECK_THROWS_WITH(accel::mesh_sizes_from_environment(), Catch::StartsWith("accel: PARALLELISM_CONFIG_CP_SIZE=\"0\""));
}
