// Issue 18's checkpoint pre-hooks on every process of a job (dist.gloo.P2.checkpoint): each process runs its hooks,
// and a hook that throws on one process fails the save or the load on all of them, none left waiting, nothing
// written or loaded. One process: tests/unit/test_checkpoint_hooks.cpp.
#include <catch2/catch.hpp>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

using gloo_accelerator = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
using module_list = std::vector<std::shared_ptr<torch::nn::Module>>;
using weight_list = std::vector<accel::safetensors::tensor_list>;

}  // namespace

TEST_CASE(
    "save and load pre-hooks run on every process; one that throws on one process fails the save and the load on "
    "every process, the checkpoint and the model as they were",
    "[checkpoint]") {
  const auto dir = accel_test::job_directory("accel_hooks_");
  gloo_accelerator acc;
  const int rank = acc.process_index();
  torch::manual_seed(1);
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  int saves = 0, loads = 0;
  acc.register_save_state_pre_hook([&](const module_list& models, weight_list& weights, const std::filesystem::path&) {
    ++saves;
    CHECK(models.size() == 1);
    CHECK(weights.size() == 1);
  });
  acc.register_load_state_pre_hook([&](module_list& models, const std::filesystem::path&) {
    ++loads;
    CHECK(models.size() == 1);
  });
  acc.save_state(dir);
  acc.load_state(dir);
  // Every process ran each hook once.
  CHECK(torch::equal(acc.gather(torch::tensor({saves, loads}).reshape({1, 2})),
                     torch::ones({acc.num_processes(), 2}, torch::kInt)));

  const auto manifest = accel_test::text_of(dir / "accel_checksums.txt");
  {
    torch::NoGradGuard no_grad;
    net->bias.fill_(7);
  }
  auto failing_save =
      acc.register_save_state_pre_hook([rank](const module_list&, weight_list&, const std::filesystem::path&) {
        if (rank == 1) throw std::runtime_error("process 1's save hook failed");
      });
  // Before the agreement the other process would have gone on to its barrier and waited for the timeout.
  CHECK_THROWS_WITH(acc.save_state(dir),
                    rank == 1 ? Catch::Contains("process 1's save hook failed")
                              : Catch::Contains("accel::save_state: another process failed while running the "
                                                "save_state pre-hooks (process 1: process 1's save hook failed)"));
  acc.wait_for_everyone();
  CHECK(accel_test::text_of(dir / "accel_checksums.txt") == manifest);
  CHECK_FALSE(std::filesystem::exists(dir.string() + ".partial"));
  failing_save.remove();

  auto failing_load = acc.register_load_state_pre_hook([rank](module_list&, const std::filesystem::path&) {
    if (rank == 0) throw std::runtime_error("process 0's load hook failed");
  });
  CHECK_THROWS_WITH(acc.load_state(dir),
                    rank == 0 ? Catch::Contains("process 0's load hook failed")
                              : Catch::Contains("accel::load_state: another process failed while running the "
                                                "load_state pre-hooks (process 0: process 0's load hook failed)"));
  CHECK(net->bias.item<float>() == 7.0f);  // nothing loaded anywhere
  failing_load.remove();
  acc.load_state(dir);
  CHECK(net->bias.item<float>() != 7.0f);
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
}
