// The policy seams: test-only parallel policies (tests/policies/counting_parallel.hpp, derived from data_parallel;
// tests/policies/step_synchronised.hpp, written against the facets) and a test-only precision policy with state
// (tests/policies/watching_precision.hpp), each one file, driven by the accelerator through its
// hooks and checkpointed through save_state/load_state; and a checkpoint written by accel 0.1, before the policies
// saved their own state, still loads (tests/data/checkpoint-v0.1).
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "policies/counting_parallel.hpp"
#include "policies/step_synchronised.hpp"
#include "policies/watching_precision.hpp"
#include "support.hpp"

using namespace accel_test;

namespace {
using seam_accelerator = accel::accelerator<watching_precision, counting_parallel, accel::accumulate<2>>;
using plain_accelerator = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>, accel::accumulate<2>>;

/// 6 micro-steps of accumulation 2 with gradient clipping on each (3 optimizer steps); the last loss.
template <class Accelerator>
void train_clipped(Accelerator& acc, mlp& net, torch::optim::SGD& optimizer) {
  auto [model, opt] = acc.prepare(net, optimizer);
  torch::manual_seed(5);
  for (int i = 0; i < 6; ++i) {
    auto scope = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(torch::randn({4, 3})), torch::randn({4, 1})) * (i + 1));
    acc.clip_grad_norm_(net->parameters(), 0.5);
    opt.step();
    opt.zero_grad();
  }
}

std::set<std::string> keys_of(const std::filesystem::path& file) {
  torch::serialize::InputArchive archive;
  archive.load_from(file.string());
  const auto keys = archive.keys();
  return {keys.begin(), keys.end()};
}
}  // namespace

TEST_CASE("a parallel policy in one file: the accelerator steps, clips and prepares through its hooks",
          "[policies][seams]") {
  STATIC_REQUIRE(accel::parallel_policy<counting_parallel>);
  STATIC_REQUIRE(accel::precision_policy<watching_precision>);
  torch::manual_seed(1);
  mlp net(3, 8, 1);
  torch::manual_seed(1);
  mlp reference_net(3, 8, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.1), reference_optimizer(reference_net->parameters(), 0.1);
  seam_accelerator acc{{.cpu = true}};
  plain_accelerator reference{{.cpu = true}};
  train_clipped(acc, net, optimizer);
  train_clipped(reference, reference_net, reference_optimizer);

  const auto& parallel = acc.parallel();
  CHECK(parallel.optimizers_prepared == 1);
  CHECK(parallel.optimizer_steps == 3);        // one per synchronising micro-step
  CHECK(parallel.norm_reductions == 6);        // clipped on 3 steps, measured (not clipped) on the 3 others
  CHECK(parallel.non_finite_agreements == 0);  // fp32 has no overflow to agree on
  const auto& precision = acc.precision();
  CHECK(precision.parameters_prepared == 4);
  CHECK(precision.backwards == 6);
  CHECK(precision.largest_loss > 0);
  CHECK(bitwise_equal(*net, *reference_net));  // counting changed nothing
  CHECK(acc.device() == reference.device());
}

TEST_CASE(
    "a parallel policy written against the facets trains as single_process on one process, and its own state "
    "round-trips through save_state / load_state",
    "[policies][seams][checkpoint]") {
  STATIC_REQUIRE(accel::parallel_policy<step_synchronised>);
  STATIC_REQUIRE(accel::detail::uneven_inputs<step_synchronised>);
  using facet_accelerator = accel::accelerator<accel::fp32, step_synchronised, accel::accumulate<2>>;
  using reference_accelerator = accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<2>>;
  torch::manual_seed(1);
  mlp net(3, 8, 1);
  torch::manual_seed(1);
  mlp reference_net(3, 8, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.1), reference_optimizer(reference_net->parameters(), 0.1);
  const auto dir = scratch_directory("facet_policy");
  {
    facet_accelerator acc{{.cpu = true}};
    reference_accelerator reference{{.cpu = true}};
    train_clipped(acc, net, optimizer);
    train_clipped(reference, reference_net, reference_optimizer);
    CHECK(bitwise_equal(*net, *reference_net));  // one process: its average is its own gradient
    CHECK(acc.parallel().steps == 3);            // one per synchronising micro-step
    CHECK(acc.parallel().averagings == 3);       // clip, unscale and step asked; averaged once each step
    acc.save_state(dir / "state");
  }
  CHECK(keys_of(dir / "state" / "random_states_0.bin").contains("step_synchronised_steps"));
  facet_accelerator acc{{.cpu = true}};
  auto model = acc.prepare(net);
  acc.load_state(dir / "state");
  CHECK(acc.parallel().steps == 3);
  CHECK(acc.parallel().joins == 0);
  accel::detail::remove_tree(dir);
}

TEST_CASE("fp16's overflow check is agreed through the parallel policy, once per optimizer step", "[policies][seams]") {
  accel::accelerator<scaled_fp32, counting_parallel> acc{{.cpu = true}};
  torch::manual_seed(1);
  mlp net(3, 8, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, optimizer);
  for (int i = 0; i < 3; ++i) {
    acc.backward(model(torch::randn({4, 3})).pow(2).mean());
    acc.unscale_gradients();  // the step below does not unscale, nor agree, again
    opt.step();
    opt.zero_grad();
  }
  CHECK(acc.parallel().non_finite_agreements == 3);
  CHECK(acc.parallel().optimizer_steps == 3);
}

TEST_CASE("the test-only policies' own state round-trips through save_state / load_state",
          "[policies][seams][checkpoint]") {
  const auto dir = scratch_directory("policy_seams");
  double largest = 0;
  {
    torch::manual_seed(1);
    mlp net(3, 8, 1);
    torch::optim::SGD optimizer(net->parameters(), 0.1);
    seam_accelerator acc{{.cpu = true}};
    train_clipped(acc, net, optimizer);  // the prepared optimizer is gone afterwards; the model stays registered
    largest = acc.precision().largest_loss;
    acc.save_state(dir / "state");
  }
  CHECK(keys_of(dir / "state" / "random_states_0.bin").contains("counting_parallel_steps"));
  torch::manual_seed(2);
  mlp net(3, 8, 1);
  seam_accelerator acc{{.cpu = true}};
  auto model = acc.prepare(net);
  acc.load_state(dir / "state");
  CHECK(acc.parallel().optimizer_steps == 3);
  CHECK(acc.parallel().norm_reductions == 6);
  CHECK(acc.precision().backwards == 6);
  CHECK(acc.precision().largest_loss == largest);
  CHECK(acc.step() == 6);  // 6 micro-steps outside a prepared range: the count goes on, synchronising on even ones

  // A checkpoint without a policy's state is refused, naming it, and nothing is loaded (all or none).
  // Here the precision policy's state is there and the parallel policy's is not: the precision policy, loaded
  // first, gets its state back.
  {
    accel::accelerator<watching_precision, accel::single_process, accel::accumulate<2>> other{{.cpu = true}};
    auto prepared = other.prepare(net);
    other.save_state(dir / "without");
  }
  const auto before = net->parameters()[0].clone();
  CHECK_THROWS_WITH(acc.load_state(dir / "without"),
                    Catch::Contains("random_states_0.bin lacks counting_parallel's counts"));
  CHECK(acc.precision().backwards == 6);
  CHECK(acc.parallel().optimizer_steps == 3);
  CHECK(torch::equal(net->parameters()[0], before));
  accel::detail::remove_tree(dir);
}

// docs/checkpoint-format.md stays true: a checkpoint written before the policies saved their own state loads, its
// state continues training exactly, and saving it again writes the same files with the same keys (plus those added
// since, which loading does without).
TEST_CASE("a checkpoint written by accel 0.1 loads, resumes, and saves again with the same keys",
          "[checkpoint][resume]") {
  const auto data = std::filesystem::path(ACCEL_SOURCE_DIR) / "tests" / "data" / "checkpoint-v0.1";
  const auto dir = scratch_directory("checkpoint_v0_1");
  // The run that wrote the checkpoint, up to its save, and the same run done in one go. The generator is the
  // process's: each run is done with it before the next one starts.
  resumable_run<reference_accelerator> live(7, 40);
  reference_counter live_counter{.value = 1234};
  live.acc.register_for_checkpointing(live_counter);
  live.train_accumulating(reference_steps_before_save);
  const int live_step = live.acc.step(), live_schedule_steps = live.schedule.steps();
  const bool live_sync = live.acc.sync_gradients();
  const double live_lr = live.schedule.lr();
  const auto live_scaler = live.acc.precision().scaler().state();
  const auto live_position = live.batches.position();
  resumable_run<reference_accelerator> uninterrupted(7, 40);
  uninterrupted.train_accumulating(reference_steps_before_save + reference_steps_after_save);

  resumable_run<reference_accelerator> run(99, 40);  // other weights
  reference_counter counter;
  run.acc.register_for_checkpointing(counter);
  // Written before accel had manifests: refused unless allowed unchecked (issue 39, item 3).
  CHECK_THROWS_WITH(run.acc.load_state(data / "checkpoint"),
                    Catch::Contains("has no accel_checksums.txt: it was written by accel 0.1") &&
                        Catch::Contains("load_state(dir, {.allow_unchecked = true})"));
  run.acc.load_state(data / "checkpoint", {.allow_unchecked = true});
  CHECK(counter.value == 1234);
  CHECK(run.acc.step() == live_step);
  CHECK(run.acc.sync_gradients() == live_sync);
  CHECK(run.schedule.steps() == live_schedule_steps);
  CHECK(run.schedule.lr() == live_lr);
  CHECK(run.acc.precision().scaler().state().scale == live_scaler.scale);
  CHECK(run.acc.precision().scaler().state().growth_tracker == live_scaler.growth_tracker);
  CHECK(run.batches.position().epoch == live_position.epoch);
  CHECK(run.batches.position().batch == live_position.batch);
  std::map<std::string, at::Tensor> saved;
  for (auto& [name, tensor] : accel::safetensors::load(data / "checkpoint" / "model.safetensors")) saved[name] = tensor;
  for (const auto& item : run.net->named_parameters()) CHECK(torch::equal(item.value(), saved.at(item.key())));

  run.acc.save_state(dir / "again");
  std::set<std::string> old_files, new_files;
  for (const auto& entry : accel::detail::directory_entries(data / "checkpoint"))
    old_files.insert(entry.path().filename());
  for (const auto& entry : accel::detail::directory_entries(dir / "again")) new_files.insert(entry.path().filename());
  old_files.insert("accel_checksums.txt");  // accel 0.1 wrote no checksums
  CHECK(old_files == new_files);
  for (const auto& name : {"accel_state.bin", "optimizer.bin", "scheduler.bin", "custom_checkpoint.bin"})
    CHECK(keys_of(data / "checkpoint" / name) == keys_of(dir / "again" / name));
  // What later versions add (docs/checkpoint-format.md), and nothing else: the optimizer step count; and where this
  // machine has GPUs, their generators (the checkpoint was written without one).
  auto process_keys = keys_of(data / "checkpoint" / "random_states_0.bin");
  process_keys.insert("accel_optimizer_steps");
  if (torch::cuda::is_available())
    for (int device = 0; device < static_cast<int>(torch::cuda::device_count()); ++device)
      process_keys.insert("cuda_rng_" + std::to_string(device));
  CHECK(process_keys == keys_of(dir / "again" / "random_states_0.bin"));

  // The checkpoint was computed on another machine, whose CPU kernels (AVX2 or AVX-512, LibTorch 2.13 or 1.13) may
  // round differently in the last bits: its run and this machine's are compared within 1e-4. A resume that lost
  // any state (data order, generator, optimizer moments, loss scale, schedule) differs far more. Resumed ==
  // uninterrupted bit for bit is checked on runs computed here ("resume: 10 steps == 5, save, load ...").
  const auto close = [](const at::Tensor& a, const at::Tensor& b) { return torch::allclose(a, b, 1e-4, 1e-6); };
  for (const auto& item : run.net->named_parameters())
    CHECK(close(item.value(), live.net->named_parameters()[item.key()]));
  run.train_accumulating(reference_steps_after_save);
  std::map<std::string, at::Tensor> after;
  for (auto& [name, tensor] : accel::safetensors::load(data / "weights-after" / "model.safetensors"))
    after[name] = tensor;
  for (const auto& item : run.net->named_parameters()) {
    INFO(item.key());
    CHECK(close(item.value(), uninterrupted.net->named_parameters()[item.key()]));  // resumed == uninterrupted
    CHECK(close(item.value(), after.at(item.key())));
  }
  accel::detail::remove_tree(dir);
}
