// The device mesh's sizes, validation and layout (accel/device_mesh.hpp), without processes: what each refusal says,
// the variables, and the layout's invariants. check_mesh_layout.py compares the layout itself with PyTorch's.
#include <accel/config_file.hpp>
#include <accel/detail/support/worker_variables.hpp>
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

/// Unsets every variable that configures a mesh for the test's scope.
struct no_mesh_variables {
  scoped_variable flag{"ACCELERATE_USE_PARALLELISM_CONFIG", nullptr};
  scoped_variable replicate{"PARALLELISM_CONFIG_DP_REPLICATE_SIZE", nullptr};
  scoped_variable shard{"PARALLELISM_CONFIG_DP_SHARD_SIZE", nullptr};
  scoped_variable cp{"PARALLELISM_CONFIG_CP_SIZE", nullptr};
  scoped_variable tp{"PARALLELISM_CONFIG_TP_SIZE", nullptr};
  scoped_variable pp{"PARALLELISM_CONFIG_PP_SIZE", nullptr};
};

std::string config_refusal(const std::string& text) {
  try {
    (void)accel::parse_config(text, "c.yaml");
  } catch (const accel::config_error& e) {
    return e.what();
  }
  return "accepted";
}

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

TEST_CASE("pipeline stages: pp is the outermost dimension, and its peers share a dp index", "[mesh]") {
  const accel::mesh_layout layout(accel::mesh_sizes{.dp_replicate = 2, .pp = 2}, 4);
  CHECK(layout.shape() == std::vector<int>{2, 2});
  CHECK(layout.dimensions().front() == accel::mesh_dimension{"pp", {0}});
  CHECK(layout.group_of("pp", 1) == std::vector<int>{1, 3});
  CHECK(layout.group_of("dp", 2) == std::vector<int>{2, 3});
  CHECK(layout.index_along("dp", 3) == 1);  // the batches a prepared range gives rank 3: replica 1's
  CHECK(layout.index_along("pp", 3) == 1);
  const accel::mesh_layout cp_beside(accel::mesh_sizes{.dp_shard = 2, .cp = 2, .pp = 2}, 8);
  CHECK(cp_beside.group_of("pp", 5) == std::vector<int>{1, 5});
  CHECK(cp_beside.group_of("dp_shard_cp", 5) == std::vector<int>{4, 5, 6, 7});
  CHECK_THROWS_WITH(accel::validate_mesh(accel::mesh_sizes{.pp = 2}, 4),
                    Catch::Contains("dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=2") &&
                        Catch::Contains("dp_replicate = 4 / (dp_shard x cp x tp x pp) = 2"));
  no_mesh_variables none;
  scoped_variable stages{"PARALLELISM_CONFIG_PP_SIZE", "4"};
  CHECK(accel::mesh_sizes_from_environment() == accel::mesh_sizes{.pp = 4});
  CHECK(accel::parallelism_config_in_environment());
  CHECK(accel::configured_mesh({.dp_replicate_size = 2}, 8)->sizes() == accel::mesh_sizes{.dp_replicate = 2, .pp = 4});
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

TEST_CASE("a mesh is configured by ACCELERATE_USE_PARALLELISM_CONFIG, or by any size variable", "[mesh]") {
  no_mesh_variables none;
  CHECK_FALSE(accel::parallelism_config_in_environment());
  CHECK_FALSE(accel::parallelism_config_from_environment(4).has_value());
  {
    scoped_variable flag("ACCELERATE_USE_PARALLELISM_CONFIG", "True");  // all sizes 1: plain data parallelism
    const auto layout = accel::parallelism_config_from_environment(4);
    REQUIRE(layout.has_value());
    CHECK(layout->sizes() == accel::mesh_sizes{4, 1, 1, 1});
  }
  scoped_variable tp("PARALLELISM_CONFIG_TP_SIZE", "2");
  CHECK(accel::parallelism_config_in_environment());
  CHECK(accel::parallelism_config_from_environment(2)->sizes() == accel::mesh_sizes{1, 1, 1, 2});
  CHECK_THROWS_WITH(accel::parallelism_config_from_environment(4), Catch::Contains("tp=2 spans 2 processes"));
  {
    scoped_variable off("ACCELERATE_USE_PARALLELISM_CONFIG", "0");  // as Accelerate: the flag off wins
    CHECK_FALSE(accel::parallelism_config_from_environment(4).has_value());
  }
  scoped_variable odd("ACCELERATE_USE_PARALLELISM_CONFIG", "maybe");
  CHECK_THROWS_WITH(accel::parallelism_config_in_environment(),
                    Catch::StartsWith("accel: ACCELERATE_USE_PARALLELISM_CONFIG=\"maybe\" is neither true nor false"));
}

TEST_CASE("options::parallelism_config: the program's sizes, each unset one from its variable", "[mesh]") {
  no_mesh_variables none;
  CHECK_FALSE(accel::configured_mesh({}, 4).has_value());  // neither the program nor the environment
  CHECK(accel::configured_mesh({.dp_shard_size = 4}, 4)->sizes() == accel::mesh_sizes{1, 4, 1, 1});
  CHECK(accel::configured_mesh({.dp_replicate_size = 1}, 4)->sizes() == accel::mesh_sizes{4, 1, 1, 1});  // all 1
  scoped_variable replicate("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "2");
  scoped_variable shard("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4");
  CHECK(accel::configured_mesh({}, 8)->sizes() == accel::mesh_sizes{2, 4, 1, 1});  // the environment's alone
  // The program's sizes win over the variables; the ones it leaves unset are read from them, as in Accelerate.
  CHECK(accel::configured_mesh({.dp_shard_size = 2, .tp_size = 2}, 8)->sizes() == accel::mesh_sizes{2, 2, 1, 2});
  CHECK_THROWS_WITH(accel::configured_mesh({.tp_size = 2}, 8), Catch::Contains("tp=2 spans 16 processes"));
  CHECK_THROWS_WITH(accel::configured_mesh({.dp_shard_size = 0}, 8), Catch::Contains("every size must be at least 1"));
  scoped_variable off("ACCELERATE_USE_PARALLELISM_CONFIG", "false");  // turns the variables off, not the program
  CHECK_FALSE(accel::configured_mesh({}, 8).has_value());
  CHECK(accel::configured_mesh({.dp_replicate_size = 1, .dp_shard_size = 8}, 8)->sizes() ==
        accel::mesh_sizes{1, 8, 1, 1});
}

TEST_CASE("rank queries: the index along a dimension, 0 along one the mesh leaves out", "[mesh]") {
  const accel::mesh_layout layout({.dp_shard = 2, .tp = 2}, 4);  // shape [2, 2]: rank = 2 * dp_shard + tp
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(layout.index_along("dp_shard", rank) == rank / 2);
    CHECK(layout.index_along("tp", rank) == rank % 2);
    CHECK(layout.index_along("dp_replicate", rank) == 0);
    CHECK(layout.index_along("cp", rank) == 0);
    CHECK(layout.index_along("dp", rank) == rank / 2);
    CHECK(layout.index_along("pp", rank) == 0);
  }
  CHECK_THROWS_WITH(layout.index_along("sp", 0), Catch::StartsWith("accel: \"sp\" is not a mesh dimension"));
  CHECK_THROWS_AS(layout.index_along("tp", 4), accel::mesh_error);
}

TEST_CASE("the config file's parallelism_config block, nested as Accelerate writes it", "[mesh]") {
  const auto values = accel::parse_config(
      "num_processes: 8\nparallelism_config:\n  parallelism_config_cp_size: 1\n"
      "  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 2\n"
      "  parallelism_config_tp_size: 2\nmixed_precision: bf16\n",
      "c.yaml");
  CHECK(accel::has_parallelism_config(values));
  CHECK(accel::parallelism_sizes(values) == accel::mesh_sizes{2, 2, 1, 2});
  CHECK(values.mixed_precision == "bf16");  // the block ends at the first line that is not indented
  // Written back in the same layout, and read back the same.
  const auto text = accel::format_config(values);
  CHECK_THAT(text, Catch::EndsWith("parallelism_config:\n  parallelism_config_dp_replicate_size: 2\n"
                                   "  parallelism_config_dp_shard_size: 2\n  parallelism_config_cp_size: 1\n"
                                   "  parallelism_config_tp_size: 2\n"));
  CHECK(accel::parallelism_sizes(accel::parse_config(text, "again.yaml")) == accel::mesh_sizes{2, 2, 1, 2});
  // Sizes the file leaves out keep the base's (the variables, for accel launch); none set: no block written.
  accel::config_values partial;
  accel::set_config_value(partial, "parallelism_config_tp_size", "4", "--parallelism_config_tp_size");
  CHECK(accel::parallelism_sizes(partial, {.dp_shard = 3, .tp = 2}) == accel::mesh_sizes{1, 3, 1, 4});
  CHECK(accel::format_config(accel::config_values{}).find("parallelism_config") == std::string::npos);
}

TEST_CASE("the config file refuses a size outside its block, another key inside it, and sizes that do not fit",
          "[mesh]") {
  CHECK(config_refusal("parallelism_config_tp_size: 2\n") ==
        "c.yaml:1: parallelism_config_tp_size belongs in the parallelism_config block, indented under it as "
        "Accelerate writes it: a line 'parallelism_config:', then '  parallelism_config_tp_size: N'");
  CHECK(config_refusal("parallelism_config:\n  mixed_precision: bf16\n") ==
        "c.yaml:2: 'mixed_precision' is indented under 'parallelism_config:', which holds only "
        "parallelism_config_dp_replicate_size, parallelism_config_dp_shard_size, parallelism_config_cp_size, "
        "parallelism_config_tp_size, parallelism_config_pp_size and parallelism_config_cp_comm_strategy; write it at "
        "the start of its line");
  CHECK(config_refusal("parallelism_config:\n  parallelism_config_tp_size: 0\n") ==
        "c.yaml:2: parallelism_config_tp_size must be a whole number from 1 to 65536 (1: no tensor parallelism), "
        "not '0'");
  CHECK(config_refusal("parallelism_config:\n  parallelism_config_cp_comm_strategy: ring\n") ==
        "c.yaml:2: parallelism_config_cp_comm_strategy must be allgather or alltoall (how context parallelism passes "
        "keys and values), not 'ring'");
  CHECK(config_refusal("parallelism_config:\n  parallelism_config_cp_comm_strategy: alltoall\n") == "accepted");
  CHECK(config_refusal("parallelism_config:\n  parallelism_config_cp_backend: torch\n")
            .starts_with("c.yaml:2: unknown key 'parallelism_config_cp_backend'; the keys are "));
  CHECK(config_refusal("num_processes: 4\nparallelism_config:\n  parallelism_config_tp_size: 3\n") ==
        "c.yaml: the parallelism_config block with num_processes 4: accel: mesh dp_replicate=1, dp_shard=1, cp=1, "
        "tp=3 spans 3 processes (Accelerate's total_size) but the job has 4; make their product equal the number of "
        "processes, or start 3 processes");
  CHECK(config_refusal("parallelism_config: {}\nnum_processes: 2\n") == "accepted");              // an empty block
  CHECK(config_refusal("parallelism_config:\n  parallelism_config_tp_size: 2\n") == "accepted");  // sized at launch
}

TEST_CASE("context parallelism's rotation: the program's, else PARALLELISM_CONFIG_CP_COMM_STRATEGY, else all-gather",
          "[mesh]") {
  using accel::cp_comm_strategy;
  scoped_variable unset{"PARALLELISM_CONFIG_CP_COMM_STRATEGY", nullptr};
  CHECK(accel::configured_cp_comm_strategy({}) == cp_comm_strategy::allgather);
  {
    scoped_variable set{"PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall"};
    CHECK(accel::configured_cp_comm_strategy({}) == cp_comm_strategy::alltoall);
    CHECK(accel::configured_cp_comm_strategy({.cp_comm_strategy = cp_comm_strategy::allgather}) ==
          cp_comm_strategy::allgather);
  }
  scoped_variable wrong{"PARALLELISM_CONFIG_CP_COMM_STRATEGY", "ring"};
  CHECK_THROWS_WITH(accel::configured_cp_comm_strategy({}),
                    "accel: PARALLELISM_CONFIG_CP_COMM_STRATEGY is \"ring\"; context parallelism's rotations are "
                    "\"allgather\" (the default) and \"alltoall\"");
}

TEST_CASE("a worker's variables: torchrun's for its place in the job, one definition for both launchers", "[mesh]") {
  scoped_variable threads("OMP_NUM_THREADS", nullptr);
  const accel::detail::launching::job_placement job{.nnodes = 2,
                                                    .node_rank = 1,
                                                    .nproc_per_node = 3,
                                                    .master_addr = "10.0.0.1",
                                                    .master_port = 1234,
                                                    .restart_count = 2,
                                                    .max_restarts = 5};
  const accel::detail::launching::variable_list expected = {{"RANK", "5"},
                                                            {"WORLD_SIZE", "6"},
                                                            {"LOCAL_RANK", "2"},
                                                            {"LOCAL_WORLD_SIZE", "3"},
                                                            {"GROUP_RANK", "1"},
                                                            {"NODE_RANK", "1"},
                                                            {"GROUP_WORLD_SIZE", "2"},
                                                            {"ROLE_RANK", "5"},
                                                            {"ROLE_WORLD_SIZE", "6"},
                                                            {"MASTER_ADDR", "10.0.0.1"},
                                                            {"MASTER_PORT", "1234"},
                                                            {"TORCHELASTIC_RESTART_COUNT", "2"},
                                                            {"TORCHELASTIC_MAX_RESTARTS", "5"},
                                                            {"ACCEL_RESTART_COUNT", "2"},
                                                            {"OMP_NUM_THREADS", "1"}};
  CHECK(accel::detail::launching::worker_variables(job, 2) == expected);
  scoped_variable chosen("OMP_NUM_THREADS", "4");  // the user's choice is kept: not set again
  CHECK(accel::detail::launching::worker_variables(job, 2).size() == expected.size() - 1);
  CHECK_FALSE(accel::detail::launching::sets_omp_num_threads(1));
  const int port = accel::detail::launching::pick_free_port(INADDR_LOOPBACK, "", "");
  CHECK((port > 0 && port < 65536));
}
