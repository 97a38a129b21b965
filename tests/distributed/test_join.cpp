// join_uneven_inputs on P = 2, 3, 4 Gloo processes (reference cases B3 and B4 of
// ../shared/reference/accelerate-semantics.md), and the arithmetic of a join: a process that ran out of batches adds
// zeros to the others' all-reduces, and every process ends with the last one's training state.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include "policies/step_synchronised.hpp"
#include "support.hpp"

namespace {

using namespace accel_test;
using gloo_accelerator = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;

/// The samples 0, 1, ..., n - 1 as one-element float tensors: a batch of them is a column.
std::vector<at::Tensor> counting_samples(std::int64_t n) {
  std::vector<at::Tensor> samples;
  for (std::int64_t i = 0; i < n; ++i) samples.push_back(torch::tensor({static_cast<float>(i)}));
  return samples;
}

/// Every process's copy of `tensor`, in process order.
template <class Accelerator>
std::vector<at::Tensor> everyone(Accelerator& acc, const at::Tensor& tensor) {
  return acc.gather(tensor.detach().reshape({1, -1})).unbind(0);
}

/// All parameters and buffers of `module`, flattened into one tensor.
at::Tensor flat_state(const torch::nn::Module& module) {
  std::vector<at::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.detach().reshape({-1}));
  for (const auto& b : module.buffers()) parts.push_back(b.detach().reshape({-1}).to(at::kFloat));
  return torch::cat(parts);
}

}  // namespace

TEST_CASE(
    "B3 join_uneven_inputs: 3 samples of batch 1 on 2 processes, batches [0, 1] and [0]; the joined process "
    "adds zeros to the other's all-reduce",
    "[join]") {
  gloo_accelerator acc({.even_batches = false});
  const int P = acc.num_processes();
  const int r = acc.process_index();
  torch::nn::Linear net(1, 1);
  auto model = acc.prepare(net);
  auto batches = acc.prepare(accel::data_loader(counting_samples(3), {.batch_size = 1}));
  std::vector<int> batch_indices;
  {
    auto join = acc.join_uneven_inputs(model);
    int index = 0;
    for (auto&& x : batches) {
      model(x).sum().backward();
      batch_indices.push_back(index++);
    }
  }
  // Process r has samples r, r + P, ... (even_batches = false); a sample's value is its gradient for the weight.
  std::vector<int> expected_indices;
  for (int i = r; i < 3; i += P) expected_indices.push_back(static_cast<int>(expected_indices.size()));
  CHECK(batch_indices == expected_indices);
  if (P == 2) CHECK(batch_indices == (r == 0 ? std::vector<int>{0, 1} : std::vector<int>{0}));
  // Round k: each process with a k-th batch adds its sample's gradient to its own (no zero_grad: the weight's is the
  // sample's value, the bias's 1), then the all-reduce replaces those with their sum over P, the joined processes
  // adding zeros and keeping theirs. Simulated for every process.
  std::vector<float> weight_grads(static_cast<std::size_t>(P)), bias_grads(static_cast<std::size_t>(P));
  for (int round = 0; round * P < 3; ++round) {
    float weight_sum = 0, bias_sum = 0;
    for (int q = 0; q < P && round * P + q < 3; ++q) {
      weight_grads[static_cast<std::size_t>(q)] += static_cast<float>(round * P + q);
      bias_grads[static_cast<std::size_t>(q)] += 1;
      weight_sum += weight_grads[static_cast<std::size_t>(q)];
      bias_sum += bias_grads[static_cast<std::size_t>(q)];
    }
    for (int q = 0; q < P && round * P + q < 3; ++q) {
      weight_grads[static_cast<std::size_t>(q)] = weight_sum / static_cast<float>(P);
      bias_grads[static_cast<std::size_t>(q)] = bias_sum / static_cast<float>(P);
    }
  }
  const auto weight_grad = weight_grads[static_cast<std::size_t>(r)];
  const auto bias_grad = bias_grads[static_cast<std::size_t>(r)];
  if (expected_indices.empty()) {
    CHECK_FALSE(net->weight.grad().defined());
  } else {
    CHECK(net->weight.grad().item<float>() == Approx(weight_grad).epsilon(1e-6));
    CHECK(net->bias.grad().item<float>() == Approx(bias_grad).epsilon(1e-6));
  }
  // Every process took part in every round: one all-reduce per bucket and round, its own or shadowed.
  const auto* reducer = acc.parallel().reducer_for(*net);
  REQUIRE(reducer != nullptr);
  const auto rounds = (3 + P - 1) / P;
  CHECK(reducer->all_reduce_count() == rounds * reducer->bucket_layout().size());
}

TEST_CASE("B4 join_uneven_inputs overrides even_batches for the scope and restores it", "[join]") {
  for (bool by_default : {true, false}) {
    gloo_accelerator acc({.even_batches = by_default});
    const int P = acc.num_processes();
    torch::nn::Linear net(1, 1);
    auto model = acc.prepare(net);
    auto loader = acc.prepare(accel::data_loader(counting_samples(2 * P + 1), {.batch_size = 1}));
    auto range = acc.prepare(std::vector<std::vector<std::int64_t>>{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}});
    const auto even_count = 3;                                   // 2P + 1 samples: 3 batches each
    const auto uneven_count = acc.process_index() == 0 ? 3 : 2;  // process 0 keeps the extra one
    const auto range_even = (9 + P - 1) / P;                     // 9 batches, P whole batches a round
    const auto range_uneven = 9 / P + (acc.process_index() < 9 % P ? 1 : 0);
    for (bool overridden : {true, false}) {
      INFO("accelerator's even_batches " << by_default << ", join's " << overridden);
      {
        auto join = acc.join_uneven_inputs({.even_batches = overridden}, model);
        CHECK(loader.unwrap().options().even_batches == overridden);
        CHECK(range.unwrap().options().even_batches == overridden);
        CHECK(count_batches(loader) == static_cast<std::size_t>(overridden ? even_count : uneven_count));
        CHECK(count_batches(range) == static_cast<std::size_t>(overridden ? range_even : range_uneven));
      }
      CHECK(loader.unwrap().options().even_batches == by_default);
      CHECK(range.unwrap().options().even_batches == by_default);
      CHECK(count_batches(loader) == static_cast<std::size_t>(by_default ? even_count : uneven_count));
    }
    {  // no override: the accelerator's value, unchanged
      auto join = acc.join_uneven_inputs(model);
      CHECK(loader.unwrap().options().even_batches == by_default);
    }
  }
}

// Also for a parallel policy written against the facets, with a join of its own (tests/policies/step_synchronised.hpp),
// whose own state (the steps it took) every process then takes from the last process too.
TEMPLATE_TEST_CASE(
    "join_uneven_inputs trains as the arithmetic says: each round's gradient is the sum of the processes still "
    "training over P; afterwards every process holds the last one's parameters, AdamW, scheduler and policy state",
    "[join]", accel::data_parallel<accel::gloo>, accel_test::step_synchronised) {
  const int P = accel::read_process_environment().world_size;
  const std::int64_t batch = 2;
  for (std::int64_t n : {batch * (P + 1), batch * (2 * P + 1) - 1, std::int64_t{3}}) {  // P + 1, 2P + 1, 2 batches
    INFO("N " << n << ", B " << batch);
    accel::accelerator<accel::fp32, TestType> acc({.even_batches = false});
    torch::manual_seed(11);
    mlp net(1, 4, 1), baseline(1, 4, 1);
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < net->parameters().size(); ++i) baseline->parameters()[i].copy_(net->parameters()[i]);
    }
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.05));
    torch::optim::AdamW baseline_optimizer(baseline->parameters(), torch::optim::AdamWOptions(0.05));
    torch::optim::StepLR scheduler(optimizer, 2, 0.5);
    torch::optim::StepLR baseline_scheduler(baseline_optimizer, 2, 0.5);
    auto [model, opt, sched, batches] =
        acc.prepare(net, optimizer, scheduler, accel::data_loader(counting_samples(n), {.batch_size = batch}));
    {
      auto join = acc.join_uneven_inputs(model);
      for (auto&& x : batches) {
        torch::mse_loss(model(x), torch::sin(x)).backward();
        opt.step();
        sched.step();
        opt.zero_grad();
      }
    }
    // The baseline: batch j of the input goes to process j % P in round j / P; a round's gradient is the sum of its
    // batches' gradients over P, and each round is one optimizer step. The scheduler steps P times per step.
    const auto samples = torch::arange(n, torch::kFloat).reshape({-1, 1});
    const auto input_batches = (n + batch - 1) / batch;
    for (std::int64_t round = 0; round * P < input_batches; ++round) {
      at::Tensor loss = torch::zeros({});
      for (std::int64_t j = round * P; j < std::min<std::int64_t>(input_batches, (round + 1) * P); ++j) {
        const auto x = samples.narrow(0, j * batch, std::min(batch, n - j * batch));
        loss = loss + torch::mse_loss(baseline(x), torch::sin(x)) / P;
      }
      loss.backward();
      baseline_optimizer.step();
      for (int q = 0; q < P; ++q) baseline_scheduler.step();
      baseline_optimizer.zero_grad();
    }
    for (const auto& copy : everyone(acc, flat_state(*net)))
      CHECK(torch::allclose(copy, flat_state(*baseline), 1e-5, 1e-6));
    const auto state = torch::cat([&] {
      std::vector<at::Tensor> flat;
      for (const auto& t : adamw_state(optimizer)) flat.push_back(t.reshape({-1}).to(at::kFloat));
      return flat;
    }());
    const auto baseline_state = torch::cat([&] {
      std::vector<at::Tensor> flat;
      for (const auto& t : adamw_state(baseline_optimizer)) flat.push_back(t.reshape({-1}).to(at::kFloat));
      return flat;
    }());
    for (const auto& copy : everyone(acc, state)) CHECK(torch::allclose(copy, baseline_state, 1e-5, 1e-7));
    const auto lr = torch::tensor({optimizer.param_groups()[0].options().get_lr()}, torch::kDouble);
    for (const auto& copy : everyone(acc, lr))
      CHECK(copy.template item<double>() == baseline_optimizer.param_groups()[0].options().get_lr());
    const auto steps = torch::tensor({acc.completed_steps()}, torch::kLong);
    for (const auto& copy : everyone(acc, steps))
      CHECK(copy.template item<std::int64_t>() == (input_batches + P - 1) / P);
    if constexpr (std::is_same_v<TestType, accel_test::step_synchronised>) {
      // Process 0 read the most batches; the others took fewer steps, and then its count.
      const auto own = torch::tensor({acc.parallel().steps, acc.parallel().joins}, torch::kLong);
      for (const auto& copy : everyone(acc, own)) {
        CHECK(copy[0].template item<std::int64_t>() == (input_batches + P - 1) / P);
        CHECK(copy[1].template item<std::int64_t>() == 1);
      }
      // Its state is in each process's checkpoint file, and loads back into a fresh accelerator.
      const auto dir = job_directory("join_facet_policy_" + std::to_string(n));
      acc.save_state(dir);
      accel::accelerator<accel::fp32, TestType> fresh({.even_batches = false});
      mlp fresh_net(1, 4, 1);
      torch::optim::AdamW fresh_optimizer(fresh_net->parameters(), torch::optim::AdamWOptions(0.05));
      torch::optim::StepLR fresh_scheduler(fresh_optimizer, 2, 0.5);
      [[maybe_unused]] auto [fresh_model, fresh_opt, fresh_sched, fresh_batches] = fresh.prepare(
          fresh_net, fresh_optimizer, fresh_scheduler, accel::data_loader(counting_samples(n), {.batch_size = batch}));
      fresh.load_state(dir);
      CHECK(fresh.parallel().steps == (input_batches + P - 1) / P);
      CHECK(fresh.parallel().joins == 1);
      CHECK(torch::equal(flat_state(*fresh_net), flat_state(*net)));
      acc.wait_for_everyone();
      if (acc.is_main_process()) accel::detail::remove_tree(dir);
    }
  }
}

TEST_CASE("after join_uneven_inputs every process holds the buffers of the last process to finish", "[join]") {
  gloo_accelerator acc({.even_batches = false});
  const int P = acc.num_processes();
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(1, 3), torch::nn::BatchNorm1d(3));
  auto model = acc.prepare(net);
  // 2P + 1 batches of 2: process 0 alone has a third batch, and its running statistics change in that round.
  auto batches = acc.prepare(accel::data_loader(counting_samples(2 * (2 * P + 1)), {.batch_size = 2}));
  at::Tensor before_sync;
  {
    auto join = acc.join_uneven_inputs(model);
    for (auto&& x : batches) model(x).sum().backward();
    before_sync = flat_state(*net).clone();
  }
  const auto copies = everyone(acc, flat_state(*net));
  for (const auto& copy : copies) CHECK(torch::equal(copy, copies[0]));
  const auto last = everyone(acc, before_sync)[0];  // process 0 trained last
  CHECK(torch::equal(copies[0], last));
  if (acc.process_index() != 0) CHECK_FALSE(torch::equal(before_sync, last));  // the sync changed something
}

TEST_CASE(
    "join_uneven_inputs: accumulation windows that end at different batches are an error on every process, "
    "not a hang",
    "[join]") {
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>, accel::accumulate<3>> acc({.even_batches = false});
  const int P = acc.num_processes();
  torch::nn::Linear net(1, 1);
  auto model = acc.prepare(net);
  // 2P + 1 samples of batch 1: process 0 has 3 batches, the others 2. Their second batch is their last, which ends
  // their window (sync_with_dataloader), while process 0's goes on.
  auto batches = acc.prepare(accel::data_loader(counting_samples(2 * P + 1), {.batch_size = 1}));
  const auto train = [&] {
    auto join = acc.join_uneven_inputs(model);
    for (auto&& x : batches) {
      auto scope = acc.accumulate(model);
      acc.backward(model(x).sum());
    }
  };
  CHECK_THROWS_WITH(train(), Catch::Contains("synchronise gradients in this backward and the others do not") &&
                                 Catch::Contains("sync_with_dataloader = false"));
  acc.wait_for_everyone();  // every process raised at the same round: the job goes on
}

TEST_CASE("join_uneven_inputs with accumulation and sync_with_dataloader = false: no-sync rounds are not shadowed",
          "[join]") {
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>, accel::accumulate<2>> acc(
      {.sync_with_dataloader = false, .even_batches = false});
  const int P = acc.num_processes();
  torch::nn::Linear net(1, 1);
  auto model = acc.prepare(net);
  auto batches = acc.prepare(accel::data_loader(counting_samples(4 * P + 1), {.batch_size = 1}));
  {
    auto join = acc.join_uneven_inputs(model);
    for (auto&& x : batches) {
      auto scope = acc.accumulate(model);
      acc.backward(model(x).sum());
    }
  }
  // Rounds 1 to 4 for everyone (2 synchronised), round 5 for process 0 alone: micro-step 5 does not synchronise, so
  // nobody all-reduces in it.
  const auto* reducer = acc.parallel().reducer_for(*net);
  CHECK(reducer->all_reduce_count() == 2 * reducer->bucket_layout().size());
}

TEST_CASE(
    "join_uneven_inputs with a communication hook: the joined processes run the hook on zeros, so that fp16 "
    "compression and PowerSGD's chained all-reduces match the others'",
    "[join]") {
  const int P = accel::read_process_environment().world_size;
  for (auto hook : {accel::comm_hook::fp16, accel::comm_hook::power_sgd}) {
    INFO("hook " << static_cast<int>(hook));
    gloo_accelerator acc(
        {.comm_hook = {.hook = hook, .power_sgd = {.start_power_sgd_iter = 2}}, .even_batches = false});
    torch::manual_seed(5);
    mlp net(1, 8, 1);
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
    // 3P + 1 batches: process 0 trains a fourth round alone, after PowerSGD has started compressing (round 3).
    auto [model, opt, batches] =
        acc.prepare(net, optimizer, accel::data_loader(counting_samples(2 * (3 * P + 1)), {.batch_size = 2}));
    {
      auto join = acc.join_uneven_inputs(model);
      for (auto&& x : batches) {
        torch::mse_loss(model(x), torch::cos(x)).backward();
        opt.step();
        opt.zero_grad();
      }
    }
    const auto copies = everyone(acc, flat_state(*net));
    for (const auto& copy : copies) CHECK(torch::equal(copy, copies[0]));
    CHECK(acc.parallel().reducer_for(*net)->all_reduce_count() ==
          4 * acc.parallel().reducer_for(*net)->bucket_layout().size());
  }
}

// Issue 39, item 2: an automatic save that came due while another process had left the loop aborted the job inside
// Gloo. Saves that come due during a join are held, and made once by every process when it ends.
TEST_CASE("redteam 2: an automatic save inside join_uneven_inputs is made once, agreed, when the join ends",
          "[redteam]") {
  const int P = accel::read_process_environment().world_size;
  const auto dir = accel_test::job_directory("accel_join_saves_");
  const accel::options options{.project = {.project_dir = dir.string(), .automatic_checkpoint_naming = true},
                               .even_batches = false};
  gloo_accelerator acc(options);
  accel::checkpoint_automatically(acc, {.every_steps = 1});
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
  acc.wait_for_everyone();
  torch::manual_seed(5);
  mlp net(1, 4, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt, batches] =
      acc.prepare(net, sgd, accel::data_loader(counting_samples(2 * P + 1), {.batch_size = 1}));
  {
    auto join = acc.join_uneven_inputs(model);  // process 0 has 3 batches, the others 2
    for (auto&& x : batches) {
      torch::mse_loss(model(x), torch::sin(x)).backward();
      opt.step();
      opt.zero_grad();
    }
  }
  CHECK(acc.completed_steps() == 3);
  const auto saved = accel::detail::numbered_checkpoints(dir / "checkpoints");
  REQUIRE(saved.size() == 1);  // held during the join, then one save
  gloo_accelerator fresh({.even_batches = false});
  mlp fresh_net(1, 4, 1);
  torch::optim::SGD fresh_sgd(fresh_net->parameters(), 0.1);
  // The same objects as when saving: the training range's position is part of the state.
  [[maybe_unused]] auto [fresh_model, fresh_opt, fresh_batches] =
      fresh.prepare(fresh_net, fresh_sgd, accel::data_loader(counting_samples(2 * P + 1), {.batch_size = 1}));
  fresh.load_state(saved.begin()->second);
  CHECK(fresh.completed_steps() == 3);
  CHECK(torch::equal(flat_state(*fresh_net), flat_state(*net)));
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
}
