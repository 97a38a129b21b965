// Gradient accumulation and LR-scheduler stepping on one process: Accelerate's semantics (reference groups E and
// H), and the equivalences that define them. The same cases on 2 Gloo processes are in test_distributed.cpp.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <vector>

#include "support.hpp"

namespace {

using namespace accel_test;

bool all_close(torch::nn::Module& a, torch::nn::Module& b, double tolerance) {
  for (std::size_t i = 0; i < a.parameters().size(); ++i)
    if (!torch::allclose(a.parameters()[i], b.parameters()[i], tolerance, tolerance)) return false;
  return true;
}

/// One pass over `batches`, each batch an empty micro-step: acc.sync_gradients() and acc.step() inside each.
template <class Accelerator, class Batches, class Model>
std::pair<std::vector<bool>, std::vector<int>> micro_step_pattern(Accelerator& acc, Batches& batches, Model& model) {
  std::vector<bool> syncs;
  std::vector<int> steps;
  for ([[maybe_unused]] auto&& batch : batches) {
    auto scope = acc.accumulate(model);
    syncs.push_back(acc.sync_gradients());
    steps.push_back(acc.step());
  }
  return {syncs, steps};
}

/// Trains with accumulate<N> on `micro` micro-batches of size B and, side by side, a plain model on the
/// concatenation of each group of N; returns whether the parameters agree.
template <class Optimizer, class... OptimizerOptions>
bool accumulated_equals_big_batch(int windows, OptimizerOptions... optimizer_options) {
  constexpr int N = 4, B = 5;
  torch::manual_seed(0);
  auto net = mlp(3, 8, 2);
  auto big = mlp(3, 8, 2);
  copy_parameters(*big, *net);
  Optimizer optimizer(net->parameters(), optimizer_options...);
  Optimizer big_optimizer(big->parameters(), optimizer_options...);
  accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<N>> acc{{.cpu = true}};
  auto micro_batches = regression_batches(N * windows, B, 3, 2, 21);
  auto [model, opt, batches] = acc.prepare(net, optimizer, micro_batches);
  for (auto&& [x, y] : batches) {
    auto scope = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  }
  for (int w = 0; w < windows; ++w) {
    std::vector<torch::Tensor> xs, ys;
    for (int k = 0; k < N; ++k) {
      xs.push_back(micro_batches[w * N + k].first);
      ys.push_back(micro_batches[w * N + k].second);
    }
    torch::mse_loss(big->forward(torch::cat(xs)), torch::cat(ys)).backward();
    big_optimizer.step();
    big_optimizer.zero_grad();
  }
  return all_close(*net, *big, 1e-6);
}

}  // namespace

TEST_CASE("N accumulated micro-batches equal one step on their concatenation", "[accumulation]") {
  CHECK(accumulated_equals_big_batch<torch::optim::SGD>(3, torch::optim::SGDOptions(0.1).momentum(0.9)));
  CHECK(accumulated_equals_big_batch<torch::optim::AdamW>(3, torch::optim::AdamWOptions(1e-2).weight_decay(0.1)));
}

TEST_CASE("10 micro-batches with N=4: three steps, the last on the short window", "[accumulation]") {
  constexpr int N = 4;
  constexpr double lr = 0.5;
  torch::manual_seed(1);
  auto net = torch::nn::Linear(3, 1);
  auto by_hand = torch::nn::Linear(3, 1);
  copy_parameters(*by_hand, *net);
  torch::optim::SGD optimizer(net->parameters(), lr);
  accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<N>> acc{{.cpu = true}};
  auto data = regression_batches(10, 2, 3, 1, 5);
  auto [model, opt, batches] = acc.prepare(net, optimizer, data);
  std::vector<bool> syncs;
  std::vector<int> steps;
  for (auto&& [x, y] : batches) {
    auto scope = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
    syncs.push_back(acc.sync_gradients());
    steps.push_back(acc.step());
  }
  CHECK(syncs == std::vector<bool>{false, false, false, true, false, false, false, true, false, true});
  CHECK(steps == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 0});
  // The same arithmetic written out: each window's gradients summed, divided by N (also the short one, as
  // Accelerate does), then p -= lr * g.
  for (int window_start : {0, 4, 8}) {
    for (auto& p : by_hand->parameters()) p.mutable_grad() = torch::Tensor();
    for (int k = window_start; k < std::min(window_start + N, 10); ++k)
      (torch::mse_loss(by_hand->forward(data[k].first), data[k].second) / N).backward();
    torch::NoGradGuard no_grad;
    for (auto& p : by_hand->parameters()) p.sub_(lr * p.grad());
  }
  CHECK(torch::allclose(net->weight, by_hand->weight, 1e-6, 1e-6));
  CHECK(torch::allclose(net->bias, by_hand->bias, 1e-6, 1e-6));
}

TEST_CASE("E3 E4 sync patterns, windows never span passes", "[accumulation]") {
  auto net = torch::nn::Linear(1, 1);
  SECTION("E3: N=2, 3 batches: [F,T,T], step 1, 2, 0, every pass") {
    accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<2>> acc{{.cpu = true}};
    auto batches = acc.prepare(regression_batches(3, 2, 1, 1));
    auto model = acc.prepare(net);
    for (int pass = 0; pass < 2; ++pass) {
      const auto [syncs, steps] = micro_step_pattern(acc, batches, model);
      CHECK(syncs == std::vector<bool>{false, true, true});
      CHECK(steps == std::vector<int>{1, 2, 0});
    }
  }
  SECTION("E4: N=3, 5 batches: [F,F,T,F,T], step 1, 2, 3, 4, 0") {
    accel::accelerator<accel::fp32, accel::single_process, accel::accumulate_dynamic> acc{
        {.cpu = true, .gradient_accumulation_steps = 3}};
    auto batches = acc.prepare(regression_batches(5, 2, 1, 1));
    auto model = acc.prepare(net);
    const auto [syncs, steps] = micro_step_pattern(acc, batches, model);
    CHECK(syncs == std::vector<bool>{false, false, true, false, true});
    CHECK(steps == std::vector<int>{1, 2, 3, 4, 0});
  }
  SECTION("J2: end_of_dataloader only on the last batch, every pass; false outside") {
    accel::accelerator<> acc{{.cpu = true}};
    auto batches = acc.prepare(regression_batches(4, 4, 1, 1));
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<bool> ends;
      for (auto&& batch : batches) {
        (void)batch;
        ends.push_back(acc.end_of_dataloader());
      }
      CHECK(ends == std::vector<bool>{false, false, false, true});
      CHECK_FALSE(acc.end_of_dataloader());
    }
  }
  SECTION("sync_with_dataloader = false: the window goes on across passes") {
    accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<2>> acc{
        {.cpu = true, .sync_with_dataloader = false}};
    auto batches = acc.prepare(regression_batches(3, 2, 1, 1));
    std::vector<bool> syncs;
    for (int pass = 0; pass < 2; ++pass)
      for (auto&& batch : batches) {
        (void)batch;
        auto scope = acc.accumulate(net);
        syncs.push_back(acc.sync_gradients());
      }
    CHECK(syncs == std::vector<bool>{false, true, false, true, false, true});
  }
}

TEST_CASE("the loss is divided by N in backward, also outside accumulate()", "[accumulation]") {
  accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<4>> acc{{.cpu = true}};
  auto w = torch::ones({1}, torch::requires_grad());
  acc.backward(w * 8);
  CHECK(w.grad().item<float>() == 2.0f);
  accel::accelerator<> plain{{.cpu = true}};
  auto v = torch::ones({1}, torch::requires_grad());
  plain.backward(v * 8);
  CHECK(v.grad().item<float>() == 8.0f);
}

TEST_CASE("no_accumulation generates no accumulation code", "[accumulation][zero-cost]") {
  accel::accelerator<> acc{{.cpu = true}};
  auto net = torch::nn::Linear(1, 1);
  auto model = acc.prepare(net);
  auto scope = acc.accumulate(model);
  STATIC_REQUIRE(std::is_empty_v<decltype(scope)>);
  STATIC_REQUIRE(std::is_empty_v<accel::no_accumulation>);
  STATIC_REQUIRE(accel::no_accumulation::sync_gradients());
  STATIC_REQUIRE(std::is_same_v<decltype(accel::no_accumulation::scale_loss(std::declval<const at::Tensor&>())),
                                const at::Tensor&>);
  CHECK(acc.sync_gradients());
}

TEST_CASE("accumulate_dynamic reads N from the options or the environment", "[accumulation]") {
  SECTION("options") {
    accel::accelerator<accel::fp32, accel::single_process, accel::accumulate_dynamic> acc{
        {.cpu = true, .gradient_accumulation_steps = 5}};
    CHECK(acc.gradient_accumulation_steps() == 5);
  }
  SECTION("the environment wins, as in Accelerate") {
    scoped_variable variable("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "3");
    accel::accelerator<accel::fp32, accel::single_process, accel::accumulate_dynamic> acc{
        {.cpu = true, .gradient_accumulation_steps = 5}};
    CHECK(acc.gradient_accumulation_steps() == 3);
  }
  SECTION("default: 1") {
    unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
    accel::accelerator<accel::fp32, accel::single_process, accel::accumulate_dynamic> acc{{.cpu = true}};
    CHECK(acc.gradient_accumulation_steps() == 1);
  }
  SECTION("bad values are named") {
    using accelerator = accel::accelerator<accel::fp32, accel::single_process, accel::accumulate_dynamic>;
    {
      scoped_variable variable("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "four");
      CHECK_THROWS_WITH(accelerator(accel::options{.cpu = true}),
                        Catch::Contains("ACCELERATE_GRADIENT_ACCUMULATION_STEPS=\"four\""));
    }
    CHECK_THROWS_WITH(accelerator(accel::options{.cpu = true, .gradient_accumulation_steps = 0}),
                      Catch::Contains("gradient_accumulation_steps = 0 must be at least 1"));
  }
  SECTION("a compile-time N and the options must agree") {
    using accelerator = accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<4>>;
    CHECK_THROWS_WITH(accelerator(accel::options{.cpu = true, .gradient_accumulation_steps = 2}),
                      Catch::Contains("contradicts accel::accumulate<4>"));
    CHECK_NOTHROW(accelerator(accel::options{.cpu = true, .gradient_accumulation_steps = 4}));
    scoped_variable variable("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "2");
    CHECK_THROWS_WITH(accelerator(accel::options{.cpu = true}),
                      Catch::Contains("ACCELERATE_GRADIENT_ACCUMULATION_STEPS=2 contradicts accel::accumulate<4>"));
  }
}

// Issue 40, item 2: Accelerate's `accelerator.gradient_accumulation_steps = N` (automatic_gradient_accumulation.py
// sets it after each out-of-memory retry); accumulate_dynamic read N once, at construction.
TEST_CASE("set_gradient_accumulation_steps: a new N between windows, refused in the middle of one", "[accumulation]") {
  using dynamic = accel::accelerator<accel::fp32, accel::single_process, accel::accumulate_dynamic>;
  dynamic acc{{.cpu = true, .gradient_accumulation_steps = 2}};
  auto net = torch::nn::Linear(1, 1);
  const auto micro_steps = [&](int count) {
    std::vector<bool> syncs;
    std::vector<int> steps;
    for (int k = 0; k < count; ++k) {
      auto scope = acc.accumulate(net);
      syncs.push_back(acc.sync_gradients());
      steps.push_back(acc.step());
    }
    return std::pair{syncs, steps};
  };
  CHECK(micro_steps(2).first == std::vector<bool>{false, true});
  acc.set_gradient_accumulation_steps(3);  // at a window's end
  CHECK(acc.gradient_accumulation_steps() == 3);
  const auto [syncs, steps] = micro_steps(4);
  CHECK(syncs == std::vector<bool>{false, false, true, false});  // a window of 3: the count started again
  CHECK(steps == std::vector<int>{1, 2, 3, 4});
  CHECK_THROWS_AS(acc.set_gradient_accumulation_steps(4), std::logic_error);
  CHECK_THROWS_WITH(acc.set_gradient_accumulation_steps(4),
                    Catch::Contains("in the middle of an accumulation window (micro-step 4, N = 3)") &&
                        Catch::Contains("after acc.free_memory()"));
  CHECK(acc.gradient_accumulation_steps() == 3);  // unchanged
  acc.free_memory();                              // forgets the open window
  acc.set_gradient_accumulation_steps(4);
  auto w = torch::ones({1}, torch::requires_grad());
  acc.backward(w * 8);  // the loss divided by the new N
  CHECK(w.grad().item<float>() == 2.0f);
  CHECK_THROWS_WITH(acc.set_gradient_accumulation_steps(0), Catch::Contains("must be at least 1"));
  dynamic fresh{{.cpu = true}};  // before any micro-step: between windows
  CHECK_NOTHROW(fresh.set_gradient_accumulation_steps(5));
}

// automatic_gradient_accumulation.py's loop: the batch size found by find_executable_batch_size, N = the batch size
// asked for / the one that fits, set on the same accelerator after free_memory(). The first attempts run out of
// memory in the middle of a window; the one that fits trains as an accelerator built with that N from the start.
TEST_CASE("after an out-of-memory retry, free_memory and a new N train as a fresh accelerator with that N",
          "[accumulation][memory]") {
  using dynamic = accel::accelerator<accel::fp32, accel::single_process, accel::accumulate_dynamic>;
  constexpr int wanted = 32;
  const auto samples = regression_batches(1, 64, 3, 2, 5).front();
  const auto train = [&](dynamic& acc, mlp net, int batch_size) {
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05));
    std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
    for (int start = 0; start + batch_size <= 64; start += batch_size)
      batches.emplace_back(samples.first.narrow(0, start, batch_size), samples.second.narrow(0, start, batch_size));
    auto [model, opt, prepared] = acc.prepare(net, sgd, batches);
    for (auto&& [x, y] : prepared) {
      auto scope = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(x), y));
      if (batch_size > 8) throw std::bad_alloc();  // "out of memory", in the middle of a window when N > 1
      opt.step();
      opt.zero_grad();
    }
  };
  const auto fresh_net = [] {
    torch::manual_seed(11);
    return mlp(3, 8, 2);
  };
  dynamic acc{{.cpu = true, .gradient_accumulation_steps = 1}};
  auto net = fresh_net();
  const int found = accel::find_executable_batch_size(
      [&](int batch_size) {
        acc.free_memory();
        acc.set_gradient_accumulation_steps(wanted / batch_size);
        net = fresh_net();
        train(acc, net, batch_size);
        return batch_size;
      },
      wanted);
  CHECK(found == 8);  // 32, 28, 25, 22, 19, 17 (N = 1), 15, 13, 11 (N = 2), 9 (N = 3) ran out of memory
  CHECK(acc.gradient_accumulation_steps() == 4);
  dynamic direct{{.cpu = true, .gradient_accumulation_steps = 4}};
  auto expected = fresh_net();
  train(direct, expected, 8);
  CHECK(bitwise_equal(*net, *expected));
}

TEST_CASE("H1 the scheduler steps with the optimizer, num_processes times", "[accumulation][scheduler]") {
  auto net = torch::nn::Linear(1, 1);
  torch::optim::SGD optimizer(net->parameters(), 1.0);
  lambda_lr schedule(optimizer, [](int n) { return 1.0 - n / 10.0; });
  SECTION("one process: one step gives 0.9") {
    accel::accelerator<> acc{{.cpu = true}};
    auto [opt, sched] = acc.prepare(optimizer, schedule);
    opt.step();
    sched.step();
    CHECK(schedule.lr() == Approx(0.9));
  }
  SECTION("not on a micro-step that does not synchronise") {
    accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<2>> acc{{.cpu = true}};
    auto [opt, sched] = acc.prepare(optimizer, schedule);
    for (int i = 0; i < 3; ++i) {
      auto scope = acc.accumulate(net);
      opt.step();
      sched.step();
    }
    CHECK(schedule.steps() == 1);
  }
  SECTION("step_scheduler_with_optimizer = false: every call steps once") {
    accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<2>> acc{
        {.cpu = true, .step_scheduler_with_optimizer = false}};
    auto [opt, sched] = acc.prepare(optimizer, schedule);
    auto scope = acc.accumulate(net);
    sched.step();
    CHECK(schedule.lr() == Approx(0.9));
    sched.step();
    CHECK(schedule.lr() == Approx(0.8));
  }
}

TEST_CASE("H3 linear schedule over 20 steps with accumulation, one process", "[accumulation][scheduler]") {
  // On one process the schedule written for 2 processes only gets half way: lr 5 at the end.
  const int N = GENERATE(1, 2, 4);
  accel::accelerator<accel::fp32, accel::single_process, accel::accumulate_dynamic> acc{
      {.cpu = true, .gradient_accumulation_steps = N}};
  CHECK(linear_schedule_learning_rates(acc, N).back() == Approx(5.0));
}
