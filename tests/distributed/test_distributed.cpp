// Multi-process tests: each case runs in every process of a real job started by `accel launch` (or torchrun),
// with P = 2, 3 or 4 Gloo processes (see tests/CMakeLists.txt). The reference groups are those of
// ../shared/reference/accelerate-semantics.md.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <ranges>
#include <set>
#include <sstream>
#include <thread>

#include <torch/csrc/jit/serialization/pickle.h>

#include <range/v3/view/chunk.hpp>
#include <range/v3/view/enumerate.hpp>

#include "support.hpp"

namespace {

using namespace accel_test;
using gloo_accelerator = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;

/// Rank r's tensor in Accelerate's test_ops.py: arange(P) + 1 + P * r.
torch::Tensor ops_tensor(int rank, int world) { return torch::arange(world, torch::kFloat) + 1 + world * rank; }

/// The regression model of Accelerate's test_sync.py: y = a * x + b.
struct regression_impl : torch::nn::Module {
  regression_impl()
      : a(register_parameter("a", torch::tensor({0.5f}))), b(register_parameter("b", torch::tensor({-0.25f}))) {}
  torch::Tensor forward(const torch::Tensor& x) { return a * x + b; }
  torch::Tensor a, b;
};
TORCH_MODULE_IMPL(regression, regression_impl);

/// Inputs and targets of one global batch (identical on every process: the same seed).
std::pair<torch::Tensor, torch::Tensor> global_regression_batch(int size, int seed) {
  torch::manual_seed(seed);
  auto x = torch::randn({size});
  return {x, 2 * x + 3 + 0.1 * torch::randn({size})};
}

/// This process's rows of a global batch.
torch::Tensor shard(const torch::Tensor& global, int rank, int world) {
  const auto per = global.size(0) / world;
  return global.narrow(0, rank * per, per);
}

std::vector<torch::Tensor> gradients(torch::nn::Module& m) {
  std::vector<torch::Tensor> grads;
  for (auto& p : m.parameters()) grads.push_back(p.grad().clone());
  return grads;
}

bool all_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tol = 1e-6) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::allclose(a[i], b[i], tol, tol)) return false;
  return true;
}

/// Accelerate's test_sync.py setting: the regression model prepared on P processes, and a plain copy (the
/// baseline) that sees the whole global batch.
struct sync_fixture {
  gloo_accelerator acc;
  const int P = acc.num_processes();
  const int r = acc.process_index();
  regression baseline;
  regression net;
  accel::prepared_model<regression, gloo_accelerator> model{acc.prepare(net)};
};

}  // namespace

TEST_CASE("F1 gather and broadcast", "[collectives]") {
  gloo_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  REQUIRE(P >= 2);
  auto gathered = acc.gather(ops_tensor(r, P));
  CHECK(torch::equal(gathered, torch::arange(P * P, torch::kFloat) + 1));
  auto mine = ops_tensor(r, P);
  auto broadcast = acc.broadcast(mine);
  CHECK(torch::equal(broadcast, torch::arange(P, torch::kFloat) + 1));
  CHECK(torch::equal(mine, broadcast));  // in place
  auto from_last = acc.broadcast(ops_tensor(r, P), P - 1);
  CHECK(torch::equal(from_last, ops_tensor(P - 1, P)));
  // 0-d tensors gather into one element per process.
  CHECK(torch::equal(acc.gather(torch::scalar_tensor(r, torch::kLong)), torch::arange(P, torch::kLong)));
  CHECK_THROWS_WITH(acc.broadcast(mine, P), Catch::Contains("from_process"));
}

TEST_CASE("F2 reduce sum, mean and max", "[collectives]") {
  gloo_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  auto sum = torch::zeros({P});
  for (int q = 0; q < P; ++q) sum += ops_tensor(q, P);
  auto mine = ops_tensor(r, P);
  CHECK(torch::equal(acc.reduce(mine), sum));  // sum is the default, as Accelerate's Accelerator
  CHECK(torch::allclose(acc.reduce(mine, accel::reduction::mean), sum / P));
  CHECK(torch::equal(acc.reduce(mine, accel::reduction::max), ops_tensor(P - 1, P)));
  CHECK(torch::equal(mine, ops_tensor(r, P)));  // the input is left alone
  if (P == 2) {
    CHECK(torch::equal(acc.reduce(mine), torch::tensor({4.f, 6.f})));
    CHECK(torch::equal(acc.reduce(mine, accel::reduction::mean), torch::tensor({2.f, 3.f})));
    CHECK(torch::equal(acc.reduce(mine, accel::reduction::max), torch::tensor({3.f, 4.f})));
  }
  // scale multiplies the result (Accelerate's reduce(..., scale)); integers give floats.
  CHECK(torch::equal(acc.reduce(mine, accel::reduction::sum, 0.5), sum * 0.5));
  CHECK(torch::allclose(acc.reduce(mine, accel::reduction::mean, 3.0), sum / P * 3));
  auto counts = acc.reduce(torch::tensor({1, 2}, torch::kLong), accel::reduction::sum, 0.25);
  CHECK(counts.scalar_type() == torch::kFloat);
  CHECK(torch::equal(counts, torch::tensor({0.25f * P, 0.5f * P})));
}

TEST_CASE("broadcast_object_list from any process, lengths differing; save writes once, on the main process",
          "[collectives]") {
  gloo_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  std::vector<std::string> words;
  if (r == 0) words = {"alpha", "b", "gamma"};
  CHECK(acc.broadcast_object_list(words) == std::vector<std::string>{"alpha", "b", "gamma"});
  std::vector<std::int64_t> numbers(static_cast<std::size_t>(r + 1), r);  // a different length on each process
  acc.broadcast_object_list(numbers, P - 1);
  CHECK(numbers == std::vector<std::int64_t>(static_cast<std::size_t>(P), P - 1));
  std::vector<at::Tensor> tensors{torch::full({2}, r)};
  acc.broadcast_object_list(tensors, 1);
  CHECK(torch::equal(tensors[0], torch::full({2}, 1)));
  CHECK_THROWS_WITH(acc.broadcast_object_list(words, P),
                    Catch::Contains("from_process " + std::to_string(P) + " is not a process of this job"));
  // save: the main process's tensors, written once, atomically, in either format.
  std::vector<std::string> where{
      r == 0 ? (std::filesystem::temp_directory_path() / ("accel_save_" + std::to_string(::getpid()))).string() : ""};
  const std::filesystem::path dir = acc.broadcast_object_list(where).front();
  if (acc.is_main_process()) std::filesystem::create_directories(dir);
  acc.wait_for_everyone();
  const accel::safetensors::tensor_list weights{{"w", torch::full({2}, r, torch::kFloat)}, {"b", torch::arange(3)}};
  acc.save(weights, dir / "weights.pt");
  acc.save(weights, dir / "weights.safetensors", /*safe_serialization=*/true);
  acc.wait_for_everyone();
  CHECK(accel::detail::directory_entries(dir).size() == 2);  // no temporary file is left
  auto safe = accel::safetensors::load(dir / "weights.safetensors");
  REQUIRE(safe.size() == 2);
  CHECK(safe[0].first == "w");
  CHECK(torch::equal(safe[0].second, torch::zeros({2})));  // the main process's
  std::ifstream in(dir / "weights.pt", std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto pickled = torch::jit::pickle_load(bytes).toGenericDict();
  CHECK(torch::equal(pickled.at("w").toTensor(), torch::zeros({2})));
  CHECK(torch::equal(pickled.at("b").toTensor(), torch::arange(3)));
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
}

TEST_CASE("set_seed: the same draws on every process, or with device_specific one stream per process",
          "[collectives]") {
  gloo_accelerator acc;
  const int r = acc.process_index();
  accel::set_seed(42);
  auto draws = torch::randn({4});
  const int c_draw = std::rand();
  auto all = acc.gather(draws.unsqueeze(0));
  for (int q = 1; q < acc.num_processes(); ++q) CHECK(torch::equal(all[q], all[0]));
  torch::manual_seed(42);
  CHECK(torch::equal(draws, torch::randn({4})));  // LibTorch's default generator, seeded
  std::srand(42);
  CHECK(c_draw == std::rand());  // and C's
  accel::set_seed(42, /*device_specific=*/true);
  auto own = torch::randn({4});
  torch::manual_seed(42 + static_cast<std::uint64_t>(r));
  CHECK(torch::equal(own, torch::randn({4})));
  auto everyone = acc.gather(own.unsqueeze(0));
  for (int q = 1; q < acc.num_processes(); ++q) CHECK_FALSE(torch::equal(everyone[q], everyone[0]));
}

TEST_CASE("F3 F6 pad_across_processes", "[collectives]") {
  gloo_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  // F3: the main process holds P + 1 elements, the others P.
  auto t = acc.is_main_process() ? torch::arange(P + 1, torch::kFloat) + 1 : ops_tensor(r, P);
  auto padded = acc.pad_across_processes(t);
  REQUIRE(padded.size(0) == P + 1);
  if (!acc.is_main_process()) {
    CHECK(torch::equal(padded.narrow(0, 0, P), t));
    CHECK(padded[P].item<float>() == 0);
  } else {
    CHECK(torch::equal(padded, t));
  }
  // F6: (r + 2, 10) pads to P + 1 rows; pad_first puts the padding first.
  auto rows = torch::ones({r + 2, 10});
  auto end = acc.pad_across_processes(rows);
  auto first = acc.pad_across_processes(rows, 0, 0, true);
  REQUIRE(end.sizes() == torch::IntArrayRef({P + 1, 10}));
  REQUIRE(first.sizes() == torch::IntArrayRef({P + 1, 10}));
  const int padding = P + 1 - (r + 2);
  CHECK(end.sum().item<float>() == 10 * (r + 2));
  CHECK(end.narrow(0, r + 2, padding).abs().sum().item<float>() == 0);
  CHECK(first.narrow(0, 0, padding).abs().sum().item<float>() == 0);
  CHECK(first.narrow(0, padding, r + 2).min().item<float>() == 1);
  // pad_index and another dimension; nested structures.
  auto wide = acc.pad_across_processes(torch::ones({2, r + 1}), 1, -1);
  CHECK(wide.size(1) == P);
  auto nested = acc.pad_across_processes(std::make_pair(torch::ones({r + 1}), std::vector{torch::ones({1})}));
  CHECK(nested.first.size(0) == P);
  CHECK(nested.second[0].size(0) == 1);
  // All gather once padded.
  CHECK(acc.gather(end).size(0) == P * (P + 1));
}

TEST_CASE("F4 gather_object and nested gather", "[collectives]") {
  gloo_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  std::vector<std::int64_t> expected(P);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(acc.gather_object(std::vector<std::int64_t>{r}) == expected);  // flattened one level
  auto strings = acc.gather_object(std::string(r + 1, 'x'));
  REQUIRE(strings.size() == static_cast<std::size_t>(P));
  for (int q = 0; q < P; ++q) CHECK(strings[q] == std::string(q + 1, 'x'));
  // Values of different lengths per process.
  auto lists = acc.gather_object(std::vector<std::int64_t>(r + 1, r));
  CHECK(lists.size() == static_cast<std::size_t>(P * (P + 1) / 2));
  // A non-contiguous tensor gathers fine.
  auto matrix = (torch::arange(6, torch::kFloat).reshape({2, 3}) + 10 * r).t();
  REQUIRE(!matrix.is_contiguous());
  auto gathered = acc.gather(matrix);
  CHECK(gathered.size(0) == 3 * P);
  CHECK(torch::equal(gathered.narrow(0, 3 * r, 3), matrix));
  // Nested structures keep their shape.
  auto pair = acc.gather(
      std::make_tuple(torch::full({1}, r), std::map<std::string, torch::Tensor>{{"k", torch::full({2}, r)}}));
  CHECK(std::get<0>(pair).size(0) == P);
  CHECK(std::get<1>(pair).at("k").size(0) == 2 * P);
}

TEST_CASE("F5 debug mode rejects shapes that differ (redteam 12: and dtypes; on every process, naming them)",
          "[debug]") {
  // Run with ACCELERATE_DEBUG_MODE=1 in the environment (tests/CMakeLists.txt).
  gloo_accelerator acc;
  const int r = acc.process_index();
  CHECK(torch::equal(acc.gather(torch::ones({2})), torch::ones({2 * acc.num_processes()})));
  CHECK_THROWS_AS(acc.gather(torch::ones({r + 1})), accel::distributed_operation_error);
  CHECK_THROWS_WITH(acc.reduce(torch::ones({r + 1})), Catch::Contains("shapes or dtypes differ between processes") &&
                                                          Catch::Contains("process 0: Float [1]") &&
                                                          Catch::Contains("process 1: Float [2]"));
  // The same number of elements in another shape would gather wrong values silently; another dtype, garbage.
  CHECK_THROWS_WITH(acc.gather(r == 0 ? torch::ones({2, 3}) : torch::ones({3, 2})),
                    Catch::Contains("process 0: Float [2, 3]") && Catch::Contains("process 1: Float [3, 2]"));
  CHECK_THROWS_WITH(acc.gather(r == 0 ? torch::ones({2}) : torch::ones({2}, torch::kDouble)),
                    Catch::Contains("process 0: Float [2]") && Catch::Contains("process 1: Double [2]"));
  CHECK(torch::equal(acc.gather(torch::ones({2})), torch::ones({2 * acc.num_processes()})));  // still in step
}

TEST_CASE("G4 set_trigger and check_trigger", "[collectives]") {
  gloo_accelerator acc;
  CHECK_FALSE(acc.check_trigger());
  if (acc.is_main_process()) acc.set_trigger();
  CHECK(acc.check_trigger());
  CHECK_FALSE(acc.check_trigger());
  if (acc.is_last_process()) acc.set_trigger();
  CHECK(acc.check_trigger());
}

TEST_CASE("G5 main_process_first and on_process", "[collectives]") {
  gloo_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  const auto dir = accel_test::job_directory("accel_main_first_");
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
  acc.wait_for_everyone();
  {
    auto scope = acc.main_process_first();
    if (acc.is_main_process()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others must still be waiting
      std::filesystem::create_directories(dir);
      std::ofstream(dir / "written_by_main") << "main";
    } else {
      CHECK(std::filesystem::exists(dir / "written_by_main"));
    }
  }
  auto mine = acc.on_process(P - 1, [&] { return r; });
  CHECK(mine.has_value() == (r == P - 1));
  auto main_only = acc.on_main_process([] { return 42; });
  CHECK(main_only.value_or(0) == (r == 0 ? 42 : 0));
  int ran = 0;
  acc.on_local_main_process([&] { ++ran; });
  acc.on_last_process([&] { ran += 10; });
  CHECK(ran == (acc.is_local_main_process() ? 1 : 0) + (acc.is_last_process() ? 10 : 0));
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
}

TEST_CASE("prepare broadcasts process 0's parameters and buffers", "[ddp]") {
  gloo_accelerator acc;
  torch::manual_seed(100 + acc.process_index());  // every process builds different weights
  auto net = mlp(4, 8, 2);
  auto norm = torch::nn::BatchNorm1d(4);
  norm->running_mean.fill_(acc.process_index());
  auto model = acc.prepare(net);
  auto prepared_norm = acc.prepare(norm);
  for (auto& p : net->parameters()) CHECK(torch::equal(acc.gather(p.unsqueeze(0)).std(0), torch::zeros_like(p)));
  CHECK(norm->running_mean.abs().sum().item<float>() == 0);
}

TEST_CASE("G2 P processes with batch B equal one process with batch P*B", "[ddp]") {
  // Several bucket layouts: one bucket, and a bucket per tensor or two (tiny caps).
  auto bucket_mb = GENERATE(25.0, 0.00005);
  gloo_accelerator acc(accel::options{.buckets = {.first_bucket_mb = bucket_mb / 2, .bucket_cap_mb = bucket_mb}});
  const int P = acc.num_processes(), r = acc.process_index();
  const int B = 8;
  torch::manual_seed(1);
  auto baseline = mlp(3, 16, 2);
  torch::manual_seed(1000 + r);  // different on every process: prepare must broadcast process 0's
  auto net = mlp(3, 16, 2);
  if (r == 0) copy_parameters(*net, *baseline);
  torch::optim::SGD opt(net->parameters(), 0.1);
  torch::optim::SGD baseline_opt(baseline->parameters(), 0.1);
  auto [model, optimizer] = acc.prepare(net, opt);
  if (bucket_mb < 0.001) CHECK(acc.parallel().reducer_for(*net)->bucket_layout().size() >= 3);
  auto data = regression_batches(6, B * P, 3, 2, 5);  // the same global batches on every process
  for (int epoch = 0; epoch < 3; ++epoch)
    for (auto& [x, y] : data) {
      torch::mse_loss(model(shard(x, r, P)), shard(y, r, P)).backward();
      optimizer.step();
      optimizer.zero_grad();
      torch::mse_loss(baseline(x), y).backward();
      baseline_opt.step();
      baseline_opt.zero_grad();
    }
  for (std::size_t i = 0; i < net->parameters().size(); ++i)
    CHECK(torch::allclose(net->parameters()[i], baseline->parameters()[i], 1e-5, 1e-5));
}

TEST_CASE("one all-reduce per bucket per backward, overlapped with backward", "[ddp]") {
  gloo_accelerator acc(accel::options{.buckets = {.first_bucket_mb = 0.00002, .bucket_cap_mb = 0.00005}});
  auto net = mlp(8, 16, 4);
  auto model = acc.prepare(net);
  auto* reducer = acc.parallel().reducer_for(*net);
  REQUIRE(reducer != nullptr);
  const auto layout = reducer->bucket_layout();
  REQUIRE(layout.size() >= 3);
  CHECK(layout.front().front() == net->parameters().size() - 1);  // reverse registration order
  torch::mse_loss(model(torch::randn({4, 8})), torch::randn({4, 4})).backward();
  CHECK(reducer->all_reduce_count() == layout.size());
  // The buckets of the last layers went out while backward was still computing the first layers' gradients.
  CHECK(reducer->overlapped_count() >= layout.size() - 1);
  {
    auto scope = acc.no_sync(model);
    torch::mse_loss(model(torch::randn({4, 8})), torch::randn({4, 4})).backward();
  }
  CHECK(reducer->all_reduce_count() == layout.size());
}

TEST_CASE_METHOD(sync_fixture, "whether a backward syncs is decided by its forward, as in DDP", "[ddp]") {
  auto [x, y] = global_regression_batch(16 * P, 7);
  SECTION("no_sync around the forward only: not synchronised") {
    torch::Tensor loss;
    {
      auto scope = acc.no_sync(model);
      loss = torch::mse_loss(model(shard(x, r, P)), shard(y, r, P));
    }
    loss.backward();
    torch::mse_loss(baseline(x), y).backward();
    CHECK_FALSE(all_close(gradients(*net), gradients(*baseline)));
  }
  SECTION("no_sync around the backward only: synchronised") {
    auto loss = torch::mse_loss(model(shard(x, r, P)), shard(y, r, P));
    {
      auto scope = acc.no_sync(model);
      loss.backward();
    }
    torch::mse_loss(baseline(x), y).backward();
    CHECK(all_close(gradients(*net), gradients(*baseline)));
  }
}

TEST_CASE("a backward that throws half-way leaves the next step correct", "[ddp]") {
  gloo_accelerator acc(accel::options{.buckets = {.first_bucket_mb = 0.00005, .bucket_cap_mb = 0.00005}});
  const int P = acc.num_processes(), r = acc.process_index();
  torch::manual_seed(3);
  auto baseline = mlp(3, 16, 2);
  auto net = mlp(3, 16, 2);
  copy_parameters(*net, *baseline);
  auto model = acc.prepare(net);
  auto data = regression_batches(1, 4 * P, 3, 2, 11);
  auto& [x, y] = data[0];
  // Every process fails the same way: fc1.weight's hook throws once the last layer's buckets have gone out.
  auto hook = net->fc1->weight.register_hook(
      [](torch::Tensor) -> torch::Tensor { throw std::runtime_error("hook fails on purpose"); });
  CHECK_THROWS_WITH(torch::mse_loss(model(shard(x, r, P)), shard(y, r, P)).backward(),
                    Catch::Contains("hook fails on purpose"));
  CHECK(acc.parallel().reducer_for(*net)->all_reduce_count() > 0);
  net->fc1->weight.remove_hook(hook);
  net->zero_grad();
  torch::mse_loss(model(shard(x, r, P)), shard(y, r, P)).backward();
  torch::mse_loss(baseline(x), y).backward();
  CHECK(all_close(gradients(*net), gradients(*baseline), 1e-5));
}

TEST_CASE("a parameter no process uses keeps no gradient, as in DDP", "[ddp]") {
  struct with_spare_impl : torch::nn::Module {
    with_spare_impl()
        : used(register_module("used", torch::nn::Linear(2, 1))),
          spare(register_module("spare", torch::nn::Linear(2, 1))) {}
    torch::Tensor forward(const torch::Tensor& x) { return used(x); }
    torch::nn::Linear used, spare;
  };
  gloo_accelerator acc;
  auto net = std::make_shared<with_spare_impl>();
  auto model = acc.prepare(net);
  model(torch::ones({1, 2})).sum().backward();
  CHECK(net->used->weight.grad().defined());
  CHECK_FALSE(net->spare->weight.grad().defined());  // so that momentum and weight decay leave it alone
}

TEST_CASE_METHOD(sync_fixture, "backward with create_graph synchronises too", "[ddp]") {
  auto [x, y] = global_regression_batch(16 * P, 9);
  torch::mse_loss(model(shard(x, r, P)), shard(y, r, P)).backward({}, /*retain_graph=*/true, /*create_graph=*/true);
  torch::mse_loss(baseline(x), y).backward();
  CHECK(all_close(gradients(*net), gradients(*baseline)));
}

TEST_CASE_METHOD(sync_fixture, "E1 no_sync skips the all-reduce; the next synced backward catches up", "[ddp]") {
  for (int iteration = 0; iteration < 3; ++iteration) {
    auto [x, y] = global_regression_batch(16 * P, 1337 + iteration);
    torch::mse_loss(baseline(x), y).backward();
    if (iteration % 2 == 0) {
      auto scope = acc.no_sync(model);
      torch::mse_loss(model(shard(x, r, P)), shard(y, r, P)).backward();
    } else {
      torch::mse_loss(model(shard(x, r, P)), shard(y, r, P)).backward();
    }
    INFO("iteration " << iteration);
    CHECK(all_close(gradients(*net), gradients(*baseline)) == (iteration % 2 == 1));
  }
}

TEST_CASE_METHOD(sync_fixture, "E2 trigger_sync_in_backward after forwards under no_sync", "[ddp]") {
  std::vector<torch::Tensor> losses;
  std::vector<torch::Tensor> baseline_losses;
  {
    auto scope = acc.no_sync(model);
    for (int i = 0; i < 3; ++i) {
      auto [x, y] = global_regression_batch(16 * P, 42 + i);
      losses.push_back(torch::mse_loss(model(shard(x, r, P)), shard(y, r, P)));
      baseline_losses.push_back(torch::mse_loss(baseline(x), y));
    }
    for (int i = 0; i < 2; ++i) {
      losses[i].backward();
      baseline_losses[i].backward();
      CHECK_FALSE(all_close(gradients(*net), gradients(*baseline)));
    }
    auto trigger = acc.trigger_sync_in_backward(model);
    losses[2].backward();
    baseline_losses[2].backward();
    CHECK(all_close(gradients(*net), gradients(*baseline)));
  }
  CHECK(acc.parallel().gradient_sync(*net));  // the scopes restored the flag
}

TEST_CASE("a parameter unused on some processes neither hangs nor corrupts the average", "[ddp]") {
  struct branchy_impl : torch::nn::Module {
    branchy_impl()
        : shared(register_module("shared", torch::nn::Linear(2, 1))),
          odd(register_module("odd", torch::nn::Linear(2, 1))) {}
    torch::Tensor forward(const torch::Tensor& x, bool use_odd) { return use_odd ? shared(x) + odd(x) : shared(x); }
    torch::nn::Linear shared, odd;
  };
  gloo_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  auto net = std::make_shared<branchy_impl>();
  auto model = acc.prepare(net);
  auto x = torch::ones({1, 2});
  model(x, r % 2 == 1).sum().backward();  // odd's gradient exists only on odd processes
  int odd_processes = P / 2;
  CHECK(torch::allclose(net->odd->weight.grad(), torch::full({1, 2}, double(odd_processes) / P)));
  CHECK(torch::allclose(net->shared->weight.grad(), torch::ones({1, 2})));
}

TEST_CASE("a collective that times out raises instead of hanging", "[timeout]") {
  gloo_accelerator acc(accel::options{.timeout = std::chrono::seconds(5)});
  if (acc.is_main_process()) {
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(acc.reduce(torch::ones({1})), accel::collective_error);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(8));  // never joins the collective
  }
}

TEST_CASE(
    "save_state called by one process only raises there, saying that every process must call it, and leaves no "
    "checkpoint",
    "[save_alone]") {
  gloo_accelerator acc(accel::options{.timeout = std::chrono::seconds(5)});
  auto net = mlp(2, 4, 1);
  auto model = acc.prepare(net);
  const auto dir = accel_test::job_directory("accel_save_alone_");
  if (acc.is_main_process()) {
    accel::detail::remove_tree(dir);
    CHECK_THROWS_WITH(acc.save_state(dir), Catch::Contains("every process must call it") &&
                                               Catch::Contains("accel::save_state is a collective"));
    CHECK_FALSE(std::filesystem::exists(dir));
    CHECK_FALSE(std::filesystem::exists(dir.string() + ".partial"));
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(8));  // never saves
  }
}

TEST_CASE("a process that throws brings the job down", "[crash]") {
  // Run by tests/distributed/expect_prompt_failure.cmake: the launcher must exit non-zero within seconds.
  gloo_accelerator acc;
  auto net = mlp(2, 4, 1);
  auto model = acc.prepare(net);
  if (acc.process_index() == 1) {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    throw std::runtime_error("process 1 fails on purpose at " +
                             std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count()) + " s");
  }
  for (int i = 0; i < 1000; ++i) torch::mse_loss(model(torch::randn({2, 2})), torch::randn({2, 1})).backward();
}

namespace {
using accumulating_accelerator =
    accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>, accel::accumulate_dynamic>;

}  // namespace

TEST_CASE("E3 E4 accumulation on P processes: sync pattern, no_sync on micro-steps, grads = baseline",
          "[accumulation]") {
  const int N = GENERATE(2, 3);
  const bool sync_each_batch = GENERATE(false, true);
  accumulating_accelerator acc({.gradient_accumulation_steps = N, .sync_each_batch = sync_each_batch});
  const int P = acc.num_processes();
  const int batches_per_process = N == 2 ? 3 : 5;  // E3: GA=2, 3 batches; E4: GA=3, 5 batches
  auto baseline = regression();
  auto net = regression();
  auto model = acc.prepare(net);
  // Batches of 8 per process: the prepared range deals them out round robin, so iteration k's global batch is
  // batches kP .. kP + P - 1.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> all;
  for (int i = 0; i < batches_per_process * P; ++i) all.push_back(global_regression_batch(8, 100 + i));
  auto global_batch = [&](int k) {
    std::vector<torch::Tensor> xs, ys;
    for (int q = 0; q < P; ++q) {
      xs.push_back(all[k * P + q].first);
      ys.push_back(all[k * P + q].second);
    }
    return std::pair{torch::cat(xs), torch::cat(ys)};
  };
  auto batches = acc.prepare(all);
  std::vector<bool> syncs;
  std::vector<int> steps;
  int i = 0;
  for (auto&& [x, y] : batches) {
    {
      auto scope = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(x), y));
    }
    auto [gx, gy] = global_batch(i);
    (torch::mse_loss(baseline(gx), gy) / N).backward();
    syncs.push_back(acc.sync_gradients());
    steps.push_back(acc.step());
    INFO("N " << N << ", sync_each_batch " << sync_each_batch << ", iteration " << i);
    // Synchronised micro-steps (and every one with sync_each_batch) hold the average; the others only this
    // process's share.
    CHECK(all_close(gradients(*net), gradients(*baseline)) == (acc.sync_gradients() || sync_each_batch));
    if (acc.sync_gradients()) {
      net->zero_grad();
      baseline->zero_grad();
    }
    ++i;
  }
  if (N == 2) {
    CHECK(syncs == std::vector<bool>{false, true, true});
    CHECK(steps == std::vector<int>{1, 2, 0});
  } else {
    CHECK(syncs == std::vector<bool>{false, false, true, false, true});
    CHECK(steps == std::vector<int>{1, 2, 3, 4, 0});
  }
}

TEST_CASE("with N=4, one all-reduce per bucket per optimizer step", "[accumulation]") {
  accumulating_accelerator acc(
      {.buckets = {.first_bucket_mb = 0.00002, .bucket_cap_mb = 0.00005}, .gradient_accumulation_steps = 4});
  auto net = mlp(8, 16, 4);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, optimizer);
  auto* reducer = acc.parallel().reducer_for(*net);
  const auto buckets = reducer->bucket_layout().size();
  REQUIRE(buckets >= 3);
  int optimizer_steps = 0;
  for (int i = 0; i < 12; ++i) {
    auto scope = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(torch::randn({4, 8})), torch::randn({4, 4})));
    opt.step();
    opt.zero_grad();
    optimizer_steps += acc.sync_gradients();
  }
  CHECK(optimizer_steps == 3);
  CHECK(reducer->all_reduce_count() == 3 * buckets);
}

TEST_CASE("H1 the scheduler steps num_processes times per optimizer step, once with split_batches", "[accumulation]") {
  const bool split = GENERATE(false, true);
  accumulating_accelerator acc({.split_batches = split});
  const int P = acc.num_processes();
  auto net = torch::nn::Linear(1, 1);
  torch::optim::SGD optimizer(net->parameters(), 1.0);
  lambda_lr schedule(optimizer, [](int n) { return 1.0 - n / 10.0; });
  auto [opt, sched] = acc.prepare(optimizer, schedule);
  opt.step();
  sched.step();
  CHECK(schedule.lr() == Approx(split ? 0.9 : 1.0 - P / 10.0));
}

TEST_CASE("H3 linear schedule over 20 steps ends at 0 on 2 processes, whatever N", "[accumulation]") {
  const int N = GENERATE(1, 2, 4);
  accumulating_accelerator acc({.gradient_accumulation_steps = N});
  REQUIRE(acc.num_processes() == 2);  // the schedule is written for 2 processes
  const auto lrs = linear_schedule_learning_rates(acc, N);
  CHECK(lrs.back() == Approx(0.0));
  CHECK(lrs[lrs.size() - 1 - N] > 0.0);
  if (N == 2)  // Accelerate's run: 10, 9, 9, 8, 8, ..., 1, 1, 0
    for (int i = 0; i < 20; ++i) CHECK(lrs[i] == Approx(10.0 - (i + 1) / 2));
}

namespace {
/// arange(n) as tensor batches of b (the last one short).
std::vector<torch::Tensor> arange_batches(std::int64_t n, std::int64_t b) {
  std::vector<torch::Tensor> out;
  for (std::int64_t start = 0; start < n; start += b) out.push_back(torch::arange(start, std::min(n, start + b)));
  return out;
}

/// gather_for_metrics of every batch a prepared range yields, per step.
template <class Accelerator, class Range>
std::vector<torch::Tensor> gathered_steps(Accelerator& acc, Range& batches) {
  std::vector<torch::Tensor> steps;
  for (auto&& batch : batches) steps.push_back(acc.gather_for_metrics(batch));
  return steps;
}
}  // namespace

TEST_CASE("D1 D2 gather_for_metrics drops what even_batches duplicated", "[data]") {
  gloo_accelerator acc;
  const int P = acc.num_processes();
  for (auto [n, b] :
       {std::pair<std::int64_t, std::int64_t>{10, 4}, {99, 16}, {32 * P, 8}, {7, 3}, {82, 16}, {512, 16}}) {
    INFO("N " << n << " B " << b);
    auto batches = acc.prepare(arange_batches(n, b));
    auto steps = gathered_steps(acc, batches);
    CHECK(torch::equal(torch::cat(steps), torch::arange(n)));  // G1: every sample once, in order
    if (P == 2 && n == 10) {
      CHECK(torch::equal(steps[0], torch::arange(8)));
      CHECK(torch::equal(steps[1], torch::tensor({8, 9}, torch::kLong)));
    }
    if (P == 2 && n == 99) CHECK(torch::equal(steps.back(), torch::tensor({96, 97, 98}, torch::kLong)));
  }
}

TEST_CASE("G1 split_batches and data_loader with shuffling: every sample once", "[data]") {
  const int P = accel::read_process_environment().world_size;
  if (8 % P == 0) {
    gloo_accelerator acc({.split_batches = true});
    auto batches = acc.prepare(arange_batches(32 * P, 8));
    CHECK(torch::equal(torch::cat(gathered_steps(acc, batches)), torch::arange(32 * P)));
    for (std::int64_t n : {82, 99, 512}) {  // D3, the split half: totals equal N
      auto more = acc.prepare(arange_batches(n, 8));
      CHECK(torch::equal(torch::cat(gathered_steps(acc, more)), torch::arange(n)));
    }
  }
  gloo_accelerator acc;
  std::vector<std::int64_t> samples(static_cast<std::size_t>(22));
  std::iota(samples.begin(), samples.end(), 0);
  accel::data_loader loader(samples, {.batch_size = 4, .shuffle = true, .seed = 5});
  auto batches = acc.prepare(loader);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::int64_t> seen;
    for (auto&& batch : batches) {
      auto gathered = acc.gather_for_metrics(batch);
      seen.insert(seen.end(), gathered.begin(), gathered.end());
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen == samples);  // B5: the gathered index set is range(22), shuffled or not
  }
  CHECK(loader.epoch() == 2);
}

TEST_CASE(
    "data_loader workers under data_parallel: 0, 1, 2 and 4 give each process the same batches, bit for bit, "
    "over 3 shuffled epochs; each process reads only its own samples; every sample is seen once",
    "[data]") {
  /// Rows that depend on the index alone, loaded in a varying time; records which samples this process read.
  struct jittery {
    mutable std::mutex mutex;
    mutable std::set<std::int64_t> read;
    std::size_t size() const { return 37; }
    at::Tensor get(std::size_t i) const {
      {
        std::lock_guard lock(mutex);
        read.insert(static_cast<std::int64_t>(i));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100 * static_cast<int>(i % 4)));
      return torch::full({2}, static_cast<double>(i), torch::kDouble);
    }
  };
  gloo_accelerator acc;
  jittery dataset;
  std::vector<at::Tensor> expected;
  for (int workers : {0, 1, 2, 4}) {
    INFO(workers << " workers");
    accel::data_loader loader(dataset, {.batch_size = 3, .shuffle = true, .seed = 4, .num_workers = workers});
    auto batches = acc.prepare(loader);
    std::vector<at::Tensor> got;
    for (int epoch = 0; epoch < 3; ++epoch) {
      dataset.read.clear();
      std::set<std::int64_t> yielded;
      std::vector<std::int64_t> seen;
      for (auto&& batch : batches) {
        got.push_back(batch);
        auto rows = batch.select(1, 0).to(torch::kLong);
        for (std::int64_t k = 0; k < rows.numel(); ++k) yielded.insert(rows[k].item<std::int64_t>());
        auto gathered = acc.gather_for_metrics(rows);
        seen.insert(seen.end(), gathered.data_ptr<std::int64_t>(),
                    gathered.data_ptr<std::int64_t>() + gathered.numel());
      }
      CHECK(dataset.read == yielded);  // its own share, never the whole epoch
      std::sort(seen.begin(), seen.end());
      std::vector<std::int64_t> all(37);
      std::iota(all.begin(), all.end(), 0);
      CHECK(seen == all);
    }
    if (workers == 0) expected = got;
    REQUIRE(got.size() == expected.size());
    for (std::size_t k = 0; k < got.size(); ++k) CHECK(torch::equal(got[k], expected[k]));
  }
}

TEST_CASE("a range-v3 pipeline prepared under data_parallel: chunks of samples sharded, every sample gathered once",
          "[data]") {
  gloo_accelerator acc;
  std::vector<std::int64_t> samples(22);
  std::iota(samples.begin(), samples.end(), 0);
  auto batches = acc.prepare(samples | ranges::views::chunk(4));
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::int64_t> seen;
    for (auto&& [step, batch] : batches | ranges::views::enumerate) {
      CHECK(static_cast<std::int64_t>(batch.front()) ==
            4 * (static_cast<std::int64_t>(step) * acc.num_processes() + acc.process_index()) % 22);
      auto gathered = acc.gather_for_metrics(batch);
      seen.insert(seen.end(), gathered.begin(), gathered.end());
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen == samples);
  }
}

TEST_CASE("D5 a stream of 30 samples (no size), batches of 4: gather_for_metrics gathers 30, tensors or not",
          "[data]") {
  gloo_accelerator acc;
  auto stream = std::views::iota(std::int64_t{0}) | std::views::take_while([](std::int64_t i) { return i < 30; });
  accel::data_loader numbers(stream, {.batch_size = 4});
  auto batches = acc.prepare(numbers);
  std::vector<std::int64_t> seen;
  for (auto&& batch : batches) {
    auto gathered = acc.gather_for_metrics(batch);
    seen.insert(seen.end(), gathered.begin(), gathered.end());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<std::int64_t> all(30);
  std::iota(all.begin(), all.end(), 0);
  CHECK(seen == all);
  accel::data_loader rows(
      stream | std::views::transform([](std::int64_t i) { return torch::full({2}, i, torch::kLong); }),
      {.batch_size = 4});
  auto row_batches = acc.prepare(rows);
  std::vector<at::Tensor> gathered_rows;
  for (auto&& batch : row_batches) gathered_rows.push_back(acc.gather_for_metrics(batch));
  auto got = std::get<0>(torch::sort(torch::cat(gathered_rows).select(1, 0)));
  CHECK(torch::equal(got, torch::arange(30, torch::kLong)));
}

// Issue 39, item 4: with fewer samples than processes, some processes' slices of the last global batch are empty;
// gather_for_metrics then aborted in Gloo (SIGFPE on LibTorch 1.13). Each sample is now gathered once.
TEST_CASE("redteam 4: dispatch_batches with empty slices: gather_for_metrics gives each sample once", "[redteam]") {
  gloo_accelerator acc({.dispatch_batches = true});
  const int P = acc.num_processes();
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{P - 1}, std::int64_t{P + 1}}) {
    if (n < 1 || (n == 1 && P == 2 && n == P - 1)) continue;
    INFO("N = " << n << ", B = 1");
    auto batches = acc.prepare(arange_batches(n, 1));
    CHECK(torch::equal(torch::cat(gathered_steps(acc, batches)), torch::arange(n)));
  }
  // Empty tensors on every process gather into an empty tensor (LibTorch 1.13's Gloo divided by zero).
  CHECK(acc.gather(torch::empty({0, 3})).sizes() == at::IntArrayRef({0, 3}));
  CHECK(acc.gather_for_metrics(torch::empty({0})).numel() == 0);
}

TEST_CASE("dispatch_batches: D6, G1 dispatch and dispatch + split, D3 totals; only process 0 reads the range",
          "[data]") {
  const int P = accel::read_process_environment().world_size;
  gloo_accelerator acc({.dispatch_batches = true});
  {  // D6: N = 10, B = 4: r0 [0..3] then [8], r1 [4..7] then [9] (the last global batch split as it is)
    auto batches = acc.prepare(arange_batches(10, 4));
    std::vector<torch::Tensor> mine;
    for (auto&& batch : batches) mine.push_back(batch);
    if (P == 2) {
      REQUIRE(mine.size() == 2);
      CHECK(torch::equal(mine[0], torch::arange(4 * acc.process_index(), 4 * acc.process_index() + 4)));
      CHECK(torch::equal(mine[1], torch::tensor({8 + acc.process_index()}, torch::kLong)));
    }
    auto steps = gathered_steps(acc, batches);
    CHECK(torch::equal(torch::cat(steps), torch::arange(10)));
  }
  {  // G1: unshuffled range(32P), B = 8, dispatch: the gathered concatenation is arange(32P)
    auto batches = acc.prepare(arange_batches(32 * P, 8));
    CHECK(batches.size() == 32 * static_cast<std::size_t>(P) / 8 / static_cast<std::size_t>(P));
    CHECK(torch::equal(torch::cat(gathered_steps(acc, batches)), torch::arange(32 * P)));
  }
  gloo_accelerator split(
      {.split_batches = true, .dispatch_batches = true});  // G1 dispatch + split, and D3: totals equal N
  if (8 % P == 0) {
    auto batches = split.prepare(arange_batches(32 * P, 8));
    CHECK(torch::equal(torch::cat(gathered_steps(split, batches)), torch::arange(32 * P)));
  }
  for (std::int64_t n : {82, 99, 512}) {
    INFO("N = " << n);
    if (8 % P == 0) {
      auto both = split.prepare(arange_batches(n, 8));
      CHECK(torch::equal(torch::cat(gathered_steps(split, both)), torch::arange(n)));
    }
    auto dispatched = acc.prepare(arange_batches(n, 8));
    CHECK(torch::equal(torch::cat(gathered_steps(acc, dispatched)), torch::arange(n)));
  }
  // Only process 0 reads the range: elsewhere its batches are never touched.
  struct counted {
    std::vector<torch::Tensor> batches;
    mutable int reads = 0;
    struct iterator {
      const counted* owner;
      std::size_t i;
      torch::Tensor operator*() const {
        ++owner->reads;
        return owner->batches[i];
      }
      iterator& operator++() {
        ++i;
        return *this;
      }
      bool operator!=(const iterator& other) const { return i != other.i; }
    };
    iterator begin() const { return {this, 0}; }
    iterator end() const { return {this, batches.size()}; }
  };
  counted source{arange_batches(40, 4)};
  auto from_main = acc.prepare(source);
  CHECK(torch::equal(torch::cat(gathered_steps(acc, from_main)), torch::arange(40)));
  CHECK(source.reads == (acc.is_main_process() ? 10 : 0));
  // A pair of tensors travels as well; a data loader is refused, and its batches dispatch as a plain range.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs;
  for (auto& b : arange_batches(12, 3)) pairs.emplace_back(b, b * 10);
  auto paired = acc.prepare(pairs);
  for (auto&& [x, y] : paired) CHECK(torch::equal(y, x * 10));
  std::vector<std::int64_t> samples(12);
  std::iota(samples.begin(), samples.end(), 0);
  accel::data_loader loader(samples, {.batch_size = 3});
  CHECK_THROWS_WITH(acc.prepare(loader), Catch::Contains("cannot dispatch an accel::data_loader") &&
                                             Catch::Contains("std::ranges::ref_view(loader)"));
  auto dispatched_loader = acc.prepare(std::ranges::ref_view(loader));
  std::vector<std::int64_t> seen;
  for (auto&& batch : dispatched_loader) {
    auto gathered = acc.gather_for_metrics(batch);
    seen.insert(seen.end(), gathered.begin(), gathered.end());
  }
  CHECK(seen == samples);
}

TEST_CASE("D4 D7 drop_last and even_batches = false", "[data]") {
  const int P = accel::read_process_environment().world_size;
  {
    gloo_accelerator acc({.drop_last = true});
    auto batches = acc.prepare(arange_batches(10 * P + 1, 5));
    auto steps = gathered_steps(acc, batches);
    REQUIRE(steps.size() == 2);
    CHECK(steps.back().size(0) == 5 * P);  // no truncation with drop_last
  }
  if (P == 2) {  // with more processes, even_batches = false leaves them different numbers of batches
    gloo_accelerator acc({.even_batches = false});
    std::vector<std::vector<std::int64_t>> batches_of_ids;
    for (std::int64_t start = 0; start < 7; start += 2) {
      std::vector<std::int64_t> ids;
      for (auto i = start; i < std::min<std::int64_t>(7, start + 2); ++i) ids.push_back(i);
      batches_of_ids.push_back(ids);
    }
    auto batches = acc.prepare(batches_of_ids);
    std::vector<std::vector<std::int64_t>> steps;
    for (auto&& ids : batches) steps.push_back(acc.gather_for_metrics(ids));
    REQUIRE(steps.size() == 2);
    CHECK(steps[0] == std::vector<std::int64_t>{0, 1, 2, 3});
    CHECK(steps[1] == std::vector<std::int64_t>{4, 5, 6});
  }
}

TEST_CASE("J1 skip_first_batches resumes mid-epoch on every process", "[data]") {
  gloo_accelerator acc;
  const int P = acc.num_processes();
  auto batches = acc.prepare(arange_batches(16 * P, 4));
  acc.skip_first_batches(batches, 2);
  auto steps = gathered_steps(acc, batches);
  CHECK(steps.size() == 2);
  CHECK(torch::equal(torch::cat(steps), torch::arange(8 * P, 16 * P)));
  CHECK(batches.position().epoch == 1);
  CHECK(gathered_steps(acc, batches).size() == 4);  // the next pass is whole
}

namespace {
using distributed_run = resumable_run<gloo_accelerator>;
}  // namespace

TEST_CASE("resume on P processes: 10 steps == 5, save, load into other objects, 5 more, bit for bit", "[checkpoint]") {
  const auto dir = accel_test::job_directory("accel_resume_");
  distributed_run uninterrupted(1, 64);
  uninterrupted.train(10);  // 16 batches per epoch, 16 / P per process: the save falls mid-epoch
  {
    distributed_run first_half(1, 64);
    first_half.train(5);
    first_half.acc.save_state(dir);
  }
  CHECK(std::filesystem::exists(dir / ("random_states_" + std::to_string(uninterrupted.acc.process_index()) + ".bin")));
  distributed_run resumed(99, 64);
  resumed.acc.load_state(dir);
  resumed.train(5);
  CHECK(bitwise_equal(*resumed.net, *uninterrupted.net));
  CHECK(resumed.schedule.steps() == uninterrupted.schedule.steps());
  resumed.acc.wait_for_everyone();
  if (resumed.acc.is_main_process()) accel::detail::remove_tree(dir);
}

namespace {
/// A model of 3 weights and a data loader prepared under the project directory `project_dir`: the objects of the
/// checkpoints of the resume::latest agreement case, saved with weights all equal to the checkpoint's number.
struct project_run {
  explicit project_run(const std::filesystem::path& project_dir, accel::resume resume = accel::resume::none)
      : acc(accel::options{.cpu = true,
                           .project = {.project_dir = project_dir.string(), .automatic_checkpoint_naming = true}}),
        net(torch::nn::Linear(torch::nn::LinearOptions(3, 1).bias(false))),
        model(acc.prepare(net)),
        batches(acc.prepare(loader)) {
    accel::checkpoint_automatically(acc, {.resume = resume});
  }
  /// The first pass's start: resume::latest loads the agreed checkpoint there. Returns what the main process printed.
  std::string start_pass() {
    std::ostringstream printed;
    auto* const cerr = std::cerr.rdbuf(printed.rdbuf());
    try {
      for (auto&& batch : batches) {
        static_cast<void>(batch);
        break;
      }
    } catch (...) {
      std::cerr.rdbuf(cerr);
      throw;
    }
    std::cerr.rdbuf(cerr);
    return printed.str();
  }
  gloo_accelerator acc;
  torch::nn::Linear net;
  using sample = std::pair<torch::Tensor, torch::Tensor>;
  std::vector<sample> samples = std::vector<sample>(8, sample(torch::ones({3}), torch::ones({1})));
  accel::data_loader<std::vector<sample>&> loader{samples, {.batch_size = 2}};
  decltype(std::declval<gloo_accelerator&>().prepare(std::declval<torch::nn::Linear&>())) model;
  decltype(std::declval<gloo_accelerator&>().prepare(std::declval<decltype(loader)&>())) batches;
};

/// This process's view of the checkpoints: `view/checkpoints` holds copies of `saved`'s checkpoint_{k} for each k in
/// `complete`, and of checkpoint_{k} without its manifest (a save cut short) for each k in `incomplete`.
void make_view(const std::filesystem::path& saved, const std::filesystem::path& view, const std::vector<int>& complete,
               const std::vector<int>& incomplete = {}) {
  accel::detail::remove_tree(view);
  std::filesystem::create_directories(view / "checkpoints");
  const auto copy = [&](int k) {
    const auto name = "checkpoint_" + std::to_string(k);
    accel_test::copy_tree(saved / "checkpoints" / name, view / "checkpoints" / name);
    return view / "checkpoints" / name;
  };
  for (const int k : complete) copy(k);
  for (const int k : incomplete)
    std::filesystem::remove(copy(k) / std::string(accel::detail::checkpoint_files::manifest));
}
}  // namespace

// Issue 35: each process picked the newest checkpoint it saw, so on machines that do not share a disk one loaded
// checkpoint_2 while another found none, and the job failed at its first collective. The processes now agree on the
// newest complete on every process; each process here sees checkpoints of its own directory, as such a machine.
TEST_CASE("resume::latest and load_state() agree on the newest checkpoint complete on every process", "[checkpoint]") {
  const auto base = accel_test::job_directory("accel_agreed_latest_");
  const auto saved = base / "saved";
  std::filesystem::path view;
  {
    gloo_accelerator first;  // each section runs the case again: from no checkpoints
    view = base / ("process_" + std::to_string(first.process_index()));
    first.wait_for_everyone();
    if (first.is_main_process()) accel::detail::remove_tree(base);
    first.wait_for_everyone();
    project_run saver(saved);
    for (int k = 0; k < 3; ++k) {
      torch::NoGradGuard no_grad;
      saver.net->weight.fill_(k);
      saver.acc.save_state();  // checkpoint_k
    }
  }
  const auto with_views = [&](const std::vector<int>& on_0, const std::vector<int>& on_1,
                              const std::vector<int>& incomplete_on_1 = {}) {
    gloo_accelerator barrier;
    barrier.wait_for_everyone();
    const bool first = barrier.process_index() == 0;
    make_view(saved, view, first ? on_0 : on_1, first ? std::vector<int>{} : incomplete_on_1);
    barrier.wait_for_everyone();
  };
  SECTION("a newer checkpoint some process lacks is passed over, the main process naming it and them") {
    with_views({0, 1}, {0, 2}, {1});  // process 1's checkpoint_1 is incomplete: checkpoint_0 is the only common one
    project_run resumed(view, accel::resume::latest);
    const auto printed = resumed.start_pass();
    CHECK(resumed.acc.resumed_from() == view / "checkpoints" / "checkpoint_0");
    CHECK(torch::equal(resumed.net->weight, torch::zeros({1, 3})));
    if (resumed.acc.is_main_process()) {
      CHECK_THAT(printed, Catch::Contains("loading checkpoint_0, the newest checkpoint complete on every process") &&
                              Catch::Contains("checkpoint_2 under ") &&
                              Catch::Contains("is missing or incomplete on process 0 "));
    } else {
      CHECK(printed.empty());
    }
  }
  SECTION("after the resume, the next save has one number on every process, past a save cut short on any of them") {
    with_views({0}, {0}, {1});  // process 1 passes over its incomplete checkpoint_1; process 0 would save as 1
    project_run resumed(view, accel::resume::latest);
    CHECK(resumed.start_pass().empty());
    CHECK(resumed.acc.resumed_from() == view / "checkpoints" / "checkpoint_0");
    CHECK(resumed.acc.save_state() == view / "checkpoints" / "checkpoint_2");
    CHECK(resumed.acc.save_iteration() == 3);
    // The main process writes the shared files: its checkpoint_2 is whole, and it never wrote a checkpoint_1.
    if (resumed.acc.is_main_process()) {
      CHECK(accel::detail::is_complete_checkpoint(view / "checkpoints" / "checkpoint_2"));
      CHECK_FALSE(std::filesystem::exists(view / "checkpoints" / "checkpoint_1"));
    }
  }
  SECTION("the newest on every process loads, silently") {
    with_views({1, 2}, {0, 1, 2});
    project_run resumed(view, accel::resume::latest);
    CHECK(resumed.start_pass().empty());
    CHECK(resumed.acc.resumed_from() == view / "checkpoints" / "checkpoint_2");
    CHECK(torch::equal(resumed.net->weight, torch::full({1, 3}, 2.0f)));
  }
  SECTION("none complete on every process while one exists: every process throws, naming it, them and the fix") {
    with_views({0, 1, 2}, {}, {2});
    project_run resumed(view, accel::resume::latest);
    CHECK_THROWS_AS(resumed.start_pass(), accel::checkpoint_error);
    // Catch's combined matchers refer to their parts: built inside the check, not kept in a variable.
    CHECK_THROWS_WITH(resumed.acc.load_state(), Catch::Contains("no checkpoint is complete on every process") &&
                                                    Catch::Contains("checkpoint_2 under ") &&
                                                    Catch::Contains("missing or incomplete on process 1 ") &&
                                                    Catch::Contains("save_on_each_node") &&
                                                    Catch::Contains("copy checkpoint_2"));
    CHECK_FALSE(resumed.acc.resumed_from());
  }
  SECTION("none anywhere: the run starts from its own weights") {
    with_views({}, {}, {1});
    project_run resumed(view, accel::resume::latest);
    const auto initial = resumed.net->weight.detach().clone();
    CHECK(resumed.start_pass().empty());
    CHECK_FALSE(resumed.acc.resumed_from());
    CHECK(torch::equal(resumed.net->weight, initial));
  }
  gloo_accelerator last;
  last.wait_for_everyone();
  if (last.is_main_process()) accel::detail::remove_tree(base);
}

namespace {
/// Where the jobs of the resume-elsewhere cases meet (tests/CMakeLists.txt sets it): a job of 2 processes saves
/// there, jobs of 1, 3 and 4 processes load what it saved.
std::filesystem::path cross_job_directory() {
  const char* dir = std::getenv("ACCEL_TEST_CROSS_JOB_DIR");
  REQUIRE(dir != nullptr);
  return dir;
}

/// 54 samples whose targets carry their index, shuffled into batches of 3 (18 batches of the input per epoch) for
/// an MLP trained by AdamW: what a resumed run saw can be counted sample by sample.
struct indexed_run {
  using sample = std::pair<torch::Tensor, torch::Tensor>;  // x (3 features), {y, the sample's index}
  static std::vector<sample> make_samples() {
    torch::manual_seed(42);
    std::vector<sample> made;
    for (int i = 0; i < 54; ++i)
      made.emplace_back(torch::randn({3}), torch::tensor({torch::randn({}).item<float>(), static_cast<float>(i)}));
    return made;
  }
  explicit indexed_run(std::uint64_t seed)
      : net(resumable_run<gloo_accelerator>::seeded_mlp(seed)),
        optimizer(net->parameters(), torch::optim::AdamWOptions(1e-2)),
        model(acc.prepare(net)),
        opt(acc.prepare(optimizer)),
        batches(acc.prepare(loader)) {}
  /// Trains on `limit` batches (-1: the rest of the pass); returns the indices of the samples seen by every process,
  /// as gather_for_metrics gives them (even_batches' padding dropped).
  std::vector<std::int64_t> train(int limit = -1) {
    std::vector<std::int64_t> seen;
    for (auto&& [x, target] : batches) {
      acc.backward(torch::mse_loss(model(x), target.narrow(1, 0, 1)));
      opt.step();
      opt.zero_grad();
      const auto indices = acc.gather_for_metrics(target.select(1, 1).to(torch::kLong).contiguous());
      seen.insert(seen.end(), indices.data_ptr<std::int64_t>(), indices.data_ptr<std::int64_t>() + indices.numel());
      if (--limit == 0) break;
    }
    return seen;
  }
  gloo_accelerator acc{accel::options{.cpu = true}};
  std::vector<sample> samples = make_samples();
  mlp net;
  torch::optim::AdamW optimizer;
  accel::data_loader<std::vector<sample>&> loader{samples, {.batch_size = 3, .shuffle = true, .seed = 11}};
  accel::prepared_model<mlp, gloo_accelerator> model;
  accel::prepared_optimizer<torch::optim::AdamW&, gloo_accelerator> opt;
  decltype(std::declval<gloo_accelerator&>().prepare(
      std::declval<accel::data_loader<std::vector<sample>&>&>())) batches;
};

}  // namespace

TEST_CASE("saved by 2 processes mid-epoch, for jobs of another number of processes to resume",
          "[resume_elsewhere_save]") {
  indexed_run run(1);
  REQUIRE(run.acc.num_processes() == 2);
  const auto seen = run.train(5);  // 5 batches of each process: 10 of the input's 18
  CHECK(seen.size() == 30);
  run.acc.save_state(cross_job_directory() / "data_parallel");
}

TEST_CASE("resumed on another number of processes: each sample of the epoch once, the same parameters and state",
          "[resume_elsewhere_load]") {
  const auto dir = cross_job_directory() / "data_parallel";
  indexed_run run(99);
  run.acc.load_state(dir);
  // Parameters and optimizer state as they were saved.
  std::map<std::string, torch::Tensor> saved;
  for (auto& [name, tensor] : accel::safetensors::load(dir / "model.safetensors")) saved.emplace(name, tensor);
  for (const auto& item : run.net->named_parameters()) CHECK(torch::equal(item.value(), saved.at(item.key())));
  auto reference_net = resumable_run<gloo_accelerator>::seeded_mlp(5);
  torch::optim::AdamW reference(reference_net->parameters(), torch::optim::AdamWOptions(1e-2));
  const auto saved_state = adamw_state(reference, dir / "optimizer.bin");
  CHECK(saved_state.size() == 3 * 4);
  CHECK(all_equal(adamw_state(run.optimizer), saved_state));
  // The rest of epoch 0, shared between this job's processes: with the 30 samples the 2-process job saw (the first
  // 10 batches of epoch 0's order), every sample exactly once.
  auto seen = run.train();
  const auto order = run.loader.index_batches(0);
  for (std::size_t b = 0; b < 10; ++b) seen.insert(seen.end(), order[b].begin(), order[b].end());
  std::sort(seen.begin(), seen.end());
  std::vector<std::int64_t> every(54);
  std::iota(every.begin(), every.end(), 0);
  CHECK(seen == every);
  CHECK(run.batches.position().epoch == 1);
  CHECK(run.loader.epoch() == 1);
  // The next epoch is whole.
  auto next = run.train();
  std::sort(next.begin(), next.end());
  CHECK(next == every);
}

TEST_CASE("a plain range saved by 2 processes, for jobs of another number of processes to resume",
          "[resume_elsewhere_save]") {
  gloo_accelerator acc;
  auto batches = acc.prepare(arange_batches(54, 3));
  int taken = 0;
  for (auto&& batch : batches) {
    (void)batch;
    if (++taken == 5) break;
  }
  acc.save_state(cross_job_directory() / "plain_range");
}

TEST_CASE("a plain range resumed on another number of processes goes on in order, each sample once",
          "[resume_elsewhere_load]") {
  gloo_accelerator acc;
  auto batches = acc.prepare(arange_batches(54, 3));
  acc.load_state(cross_job_directory() / "plain_range");
  CHECK(torch::equal(torch::cat(gathered_steps(acc, batches)), torch::arange(30, 54)));
  CHECK(torch::equal(torch::cat(gathered_steps(acc, batches)), torch::arange(54)));  // the next pass is whole
}

// The wheel of PyTorch ships no gloo/*.h, so accel compiles c10d's ProcessGroupGloo.hpp against Debian's Gloo
// headers; Gloo's code itself must come from LibTorch alone. After Gloo is up and has all-reduced, this process has
// mapped exactly one libtorch_cpu (the one the build linked: ACCEL_EXPECTED_TORCH_CPU) and no Gloo library.
TEST_CASE("one LibTorch and one Gloo in the process: the linked libtorch_cpu, no other copy", "[runtime]") {
  gloo_accelerator acc;
  auto ones = torch::ones({4});
  CHECK(torch::equal(acc.reduce(ones, accel::reduction::sum), torch::full({4}, acc.num_processes())));
  const char* expected = std::getenv("ACCEL_EXPECTED_TORCH_CPU");
  REQUIRE(expected != nullptr);
  std::set<std::string> torch_cpu, gloo, c10d;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::filesystem::path file = line.substr(slash);
    const auto name = file.filename().string();
    if (name.starts_with("libtorch_cpu")) torch_cpu.insert(std::filesystem::canonical(file).string());
    if (name.find("gloo") != std::string::npos) gloo.insert(file.string());
    if (name.find("c10d") != std::string::npos) c10d.insert(file.string());
  }
  CHECK(torch_cpu == std::set<std::string>{std::filesystem::canonical(expected).string()});
  CHECK(gloo.empty());
  CHECK(c10d.empty());
}

namespace {
/// A registered object whose save fails on process 0 only (a full disk there, say).
struct fails_on_main_process {
  int rank = 0;
  void save(torch::serialize::OutputArchive& out) const {
    if (rank == 0) throw std::runtime_error("no space left on process 0's disk");
    out.write("rank", c10::IValue(static_cast<std::int64_t>(rank)));
  }
  void load(torch::serialize::InputArchive&) {}
};
}  // namespace

// Issue 22, item 7: a save_state that failed on process 0 (and was caught there) left the others waiting in its
// barrier until the timeout (30 minutes). The processes now agree on success: every one raises, at once.
TEST_CASE("a save_state that fails on process 0 fails on every process at once; the previous checkpoint stays",
          "[checkpoint]") {
  const auto dir = accel_test::job_directory("accel_failing_save_");
  gloo_accelerator acc;
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  acc.save_state(dir);  // a good checkpoint first
  fails_on_main_process failing{acc.process_index()};
  acc.register_for_checkpointing(failing);
  // Before the fix process 1 waited for the 30-minute timeout here: the job's 90 s limit fails that.
  CHECK_THROWS_WITH(acc.save_state(dir), acc.is_main_process()
                                             ? Catch::Contains("no space left on process 0's disk")
                                             : Catch::Contains("another process failed while writing its part"));
  acc.wait_for_everyone();
  CHECK(std::filesystem::exists(dir / "model.safetensors"));        // the good checkpoint is in place
  CHECK_FALSE(std::filesystem::exists(dir.string() + ".partial"));  // and nothing is left beside it
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
}

// Issue 39, item 1: a checkpoint whose random_states_1.bin is damaged loaded on process 0 and was refused on process 1,
// which left the processes with different weights, silently. Every process now loads or none does.
TEST_CASE("redteam 1: a load that fails on one process fails on every process, and every process keeps its state",
          "[redteam]") {
  const auto dir = accel::detail::checkpoint_directory(accel_test::job_directory("accel_failing_load_"));
  gloo_accelerator acc;
  const bool main = acc.is_main_process();
  torch::manual_seed(1);
  auto net = torch::nn::Linear(3, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto step = [&] {
    acc.backward(model(torch::ones({4, 3}) * (acc.process_index() + 1)).sum());
    opt.step();
    opt.zero_grad();
  };
  step();
  acc.save_state(dir);
  step();
  const auto trained = net->weight.detach().clone();
  for (const bool remove : {false, true}) {
    acc.wait_for_everyone();
    if (main) {
      if (remove) {
        std::filesystem::remove(dir / "random_states_1.bin");
      } else {
        const auto size = std::filesystem::file_size(dir / "random_states_1.bin");
        std::filesystem::resize_file(dir / "random_states_1.bin", size / 2);
      }
    }
    acc.wait_for_everyone();
    CHECK_THROWS_WITH(acc.load_state(dir), acc.process_index() == 1
                                               ? Catch::Contains("random_states_1.bin")
                                               : Catch::Contains("another process failed while reading " +
                                                                 dir.string() + " (process 1: accel::load_state: "));
    CHECK(torch::equal(net->weight, trained));  // nothing was loaded, here or anywhere
    if (main && !remove) std::filesystem::remove(dir / "random_states_1.bin");
  }
  step();  // a program that caught the error goes on: every process from the same weights
  for (const auto& copy : acc.gather(net->weight.detach().reshape({1, -1})).unbind(0))
    CHECK(torch::equal(copy, net->weight.detach().reshape({-1})));
  acc.wait_for_everyone();
  if (main) accel::detail::remove_tree(dir);
}

// Issue 22, item 5: models that differ between processes trained silently on scrambled weights (equal sizes) or
// failed at the first backward inside Gloo. prepare now compares them, as PyTorch's DDP does, on every process.
TEST_CASE("different models on different processes are refused at prepare, naming the first difference", "[ddp]") {
  gloo_accelerator acc;
  const bool first = acc.process_index() == 0;
  {  // as many elements in other shapes (2-3-2 on process 0, 3-2-3 elsewhere): it used to train on scrambled weights
    torch::nn::Sequential net = first ? torch::nn::Sequential(torch::nn::Linear(2, 3), torch::nn::Linear(3, 2))
                                      : torch::nn::Sequential(torch::nn::Linear(3, 2), torch::nn::Linear(2, 3));
    CHECK_THROWS_WITH(acc.prepare(net), Catch::Contains("process 1's model differs from process 0's") &&
                                            Catch::Contains("'parameter 0.weight: Float [2, 3]'") &&
                                            Catch::Contains("where process 0 has 'parameter 0.weight: Float [3, 2]'"));
  }
  {  // another dtype
    auto net = torch::nn::Linear(2, 2);
    if (!first) net->to(torch::kDouble);
    CHECK_THROWS_WITH(acc.prepare(net), Catch::Contains("'parameter weight: Double [2, 2]'"));
  }
  {  // a parameter more
    torch::nn::Sequential net = first ? torch::nn::Sequential(torch::nn::Linear(2, 2))
                                      : torch::nn::Sequential(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2));
    CHECK_THROWS_WITH(acc.prepare(net), Catch::Contains("is 'parameter 1.weight: Float [2, 2]' where process 0 has "
                                                        "nothing more"));
  }
  auto same = torch::nn::Linear(2, 2);  // and the same model on every process still prepares
  CHECK_NOTHROW(acc.prepare(same));
}

namespace {
/// The accelerator's collectives' communicator, counting its all-reduces: what local_sgd's averaging sends (the
/// gradient reducer all-reduces on the process group directly, and counts its own).
struct counting_communicator {
  accel::data_parallel<accel::gloo>::communicator_type* group;
  std::int64_t all_reduces = 0;
  [[nodiscard]] int rank() const { return group->rank(); }
  [[nodiscard]] int size() const { return group->size(); }
  auto all_reduce(at::Tensor& tensor, accel::reduction op) {
    ++all_reduces;
    return group->all_reduce(tensor, op);
  }
  void broadcast(at::Tensor& tensor, int from) { group->broadcast(tensor, from); }
  [[nodiscard]] std::vector<at::Tensor> all_gather(const at::Tensor& tensor) { return group->all_gather(tensor); }
  auto all_gather_into(at::Tensor& output, at::Tensor& input) { return group->all_gather_into(output, input); }
  auto reduce_scatter_into(at::Tensor& output, at::Tensor& input) { return group->reduce_scatter_into(output, input); }
  void barrier() { group->barrier(); }
};
struct all_reduce_counting : accel::data_parallel<accel::gloo> {
  explicit all_reduce_counting(const accel::options& opts)
      : data_parallel(opts), counted{&data_parallel::communicator()} {}
  [[nodiscard]] counting_communicator& communicator() noexcept { return counted; }
  counting_communicator counted;
};
using counting_accelerator = accel::accelerator<accel::fp32, all_reduce_counting>;

/// A model with parameters of two dtypes (float32 and float64): averaged in two flat all-reduces.
struct two_dtypes_impl : torch::nn::Module {
  two_dtypes_impl()
      : fc(register_module("fc", torch::nn::Linear(3, 2))),
        gain(register_parameter("gain", torch::tensor({1.0, 0.5}, torch::kDouble))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc(x) * gain.to(torch::kFloat); }
  torch::nn::Linear fc;
  torch::Tensor gain;
};
TORCH_MODULE_IMPL(two_dtypes, two_dtypes_impl);

/// Process `q`'s batch at step `s` of local SGD: different on every process, known to all.
std::pair<torch::Tensor, torch::Tensor> local_batch(int q, int s) {
  torch::manual_seed(1000 * q + s);
  auto x = torch::randn({4, 3});
  return {x, torch::randn({4, 2})};
}

/// Every process's model trained alone, as each process would: local SGD done by hand.
struct local_trajectories {
  std::vector<two_dtypes> copies;
  std::vector<std::unique_ptr<torch::optim::SGD>> optimizers;
  local_trajectories(two_dtypes& start, int P) {
    for (int q = 0; q < P; ++q) {
      copies.emplace_back();
      copy_parameters(*copies.back(), *start);
      optimizers.push_back(std::make_unique<torch::optim::SGD>(copies.back()->parameters(), 0.1));
    }
  }
  /// One SGD step of every copy on its own batch; returns process `r`'s gradients.
  std::vector<torch::Tensor> step(int s, int r) {
    std::vector<torch::Tensor> grads;
    for (std::size_t q = 0; q < copies.size(); ++q) {
      auto [x, y] = local_batch(static_cast<int>(q), s);
      optimizers[q]->zero_grad();
      torch::mse_loss(copies[q](x), y).backward();
      if (static_cast<int>(q) == r) grads = gradients(*copies[q]);
      optimizers[q]->step();
    }
    return grads;
  }
  /// Every copy replaced by the mean of all of them: the sum in process order, divided by their number.
  void average() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < copies[0]->parameters().size(); ++i) {
      auto sum = copies[0]->parameters()[i].clone();
      for (std::size_t q = 1; q < copies.size(); ++q) sum += copies[q]->parameters()[i];
      const auto mean = sum / static_cast<std::int64_t>(copies.size());
      for (auto& copy : copies) copy->parameters()[i].copy_(mean);
    }
  }
  /// Every copy continues from `averaged` (what the processes hold after an averaging).
  void continue_from(torch::nn::Module& averaged) {
    for (auto& copy : copies) copy_parameters(*copy, averaged);
  }
  /// Whether `model` holds process `r`'s copy after `average()`. The mean of P float32 values: exact for 2 (one
  /// addition); for more, Gloo may add them in another order than the hand-made sum does, a few units in the last
  /// place apart.
  bool averaged_as_by_hand(torch::nn::Module& model, int r) {
    const auto mine = copies[static_cast<std::size_t>(r)]->parameters();
    return copies.size() == 2 ? all_equal(model.parameters(), mine) : all_close(model.parameters(), mine, 1e-6);
  }
};

/// Whether every process holds these tensors, bit for bit.
template <class Accelerator>
bool same_on_every_process(Accelerator& acc, const std::vector<torch::Tensor>& tensors) {
  for (const auto& t : tensors) {
    const auto all = acc.gather(t.unsqueeze(0));
    for (std::int64_t q = 0; q < all.size(0); ++q)
      if (!torch::equal(all[q], t)) return false;
  }
  return true;
}
}  // namespace

TEST_CASE("local_sgd: each process trains alone, its parameters are averaged every K steps and at the end",
          "[local_sgd]") {
  counting_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index(), K = 3;
  torch::manual_seed(5);
  two_dtypes net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = acc.prepare(net, sgd);
  local_trajectories by_hand(net, P);
  auto* reducer = acc.parallel().reducer_for(*net);
  REQUIRE(reducer != nullptr);
  {
    accel::local_sgd local(acc, model, K);
    REQUIRE(local.enabled());
    CHECK_FALSE(acc.parallel().gradient_sync(*net));  // the window: no gradient all-reduce
    for (int s = 1; s <= 7; ++s) {
      INFO("step " << s);
      const auto expected_grads = by_hand.step(s, r);
      auto [x, y] = local_batch(r, s);
      acc.backward(torch::mse_loss(model(x), y));
      CHECK(all_equal(gradients(*net), expected_grads));                  // this process's batch alone
      CHECK_FALSE(same_on_every_process(acc, {net->fc->weight.grad()}));  // and so not the others'
      optimizer.step();
      optimizer.zero_grad();
      local.step();
      if (s % K == 0) {
        by_hand.average();
        CHECK(by_hand.averaged_as_by_hand(*net, r));
        CHECK(same_on_every_process(acc, net->parameters()));
        by_hand.continue_from(*net);  // so that each local step below is checked bit for bit, whatever P
      } else {
        CHECK(all_equal(net->parameters(), by_hand.copies[r]->parameters()));  // local steps: no averaging
      }
      CHECK(reducer->all_reduce_count() == 0);
      CHECK(acc.parallel().counted.all_reduces == 2 * (s / K));  // one per dtype per averaging
    }
    CHECK(local.num_steps() == 7);
    local.finish();  // once more at the end of the scope, after step 7
    by_hand.average();
    CHECK(by_hand.averaged_as_by_hand(*net, r));
    CHECK(same_on_every_process(acc, net->parameters()));
    CHECK(acc.parallel().counted.all_reduces == 2 * 3);
    CHECK(acc.parallel().gradient_sync(*net));  // finish() gave the synchronisation back
  }
  // The next backward all-reduces every bucket again.
  auto [x, y] = local_batch(r, 8);
  acc.backward(torch::mse_loss(model(x), y));
  CHECK(reducer->all_reduce_count() == reducer->bucket_layout().size());
  CHECK(same_on_every_process(acc, gradients(*net)));
}

TEST_CASE(
    "local_sgd: the scope's end averages once more; disabled, it only counts; left by an exception, it does "
    "not average",
    "[local_sgd]") {
  counting_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  torch::manual_seed(6);
  two_dtypes net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = acc.prepare(net, sgd);
  auto* reducer = acc.parallel().reducer_for(*net);
  const auto train = [&](auto& local, int s) {
    auto [x, y] = local_batch(r, s);
    acc.backward(torch::mse_loss(model(x), y));
    optimizer.step();
    optimizer.zero_grad();
    local.step();
  };
  SECTION("the destructor averages, as Accelerate's __exit__") {
    local_trajectories by_hand(net, P);
    {
      accel::local_sgd local(acc, model, 5);
      for (int s = 1; s <= 2; ++s) {
        by_hand.step(s, r);
        train(local, s);
      }
      CHECK(acc.parallel().counted.all_reduces == 0);  // 2 steps of 5: not yet
    }
    by_hand.average();
    CHECK(by_hand.averaged_as_by_hand(*net, r));
    CHECK(same_on_every_process(acc, net->parameters()));
    CHECK(acc.parallel().counted.all_reduces == 2);
    CHECK(acc.parallel().gradient_sync(*net));
    CHECK(reducer->all_reduce_count() == 0);
  }
  SECTION("disabled: gradients synchronised at every step, nothing averaged") {
    accel::local_sgd local(acc, model, 1, /*enabled=*/false);
    CHECK_FALSE(local.enabled());
    for (int s = 1; s <= 3; ++s) train(local, s);
    CHECK(local.num_steps() == 3);
    local.finish();
    CHECK(reducer->all_reduce_count() == 3 * reducer->bucket_layout().size());
    CHECK(acc.parallel().counted.all_reduces == 0);
    CHECK(same_on_every_process(acc, net->parameters()));  // data parallel training keeps them equal
  }
  SECTION("left by an exception: no averaging (the others may never come), synchronisation restored") {
    try {
      accel::local_sgd local(acc, model, 100);
      train(local, 1);
      throw std::runtime_error("the loop fails on every process");
    } catch (const std::runtime_error&) {
    }
    CHECK(acc.parallel().counted.all_reduces == 0);
    CHECK_FALSE(same_on_every_process(acc, net->parameters()));  // each process's own step, not averaged
    CHECK(acc.parallel().gradient_sync(*net));
  }
}

TEST_CASE(
    "local_sgd::finish() throws when the averaging fails (a process never joins), and restores "
    "synchronisation",
    "[local_sgd_timeout]") {
  gloo_accelerator acc(accel::options{.timeout = std::chrono::seconds(5)});
  auto net = mlp(2, 4, 1);
  auto model = acc.prepare(net);
  if (acc.is_main_process()) {
    accel::local_sgd local(acc, model, 4);
    CHECK_FALSE(acc.parallel().gradient_sync(*net));
    CHECK_THROWS_AS(local.finish(), accel::collective_error);
    CHECK(acc.parallel().gradient_sync(*net));
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(8));  // never averages
  }
}

TEST_CASE("local_sgd's destructor, unable to throw, names the failed averaging and ends the process",
          "[local_sgd_abort]") {
  // Run with PASS_REGULAR_EXPRESSION on the message (tests/CMakeLists.txt): the job fails, saying why.
  gloo_accelerator acc(accel::options{.timeout = std::chrono::seconds(5)});
  auto net = mlp(2, 4, 1);
  auto model = acc.prepare(net);
  if (acc.is_main_process()) {
    accel::local_sgd local(acc, model, 4);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(8));  // never averages
  }
}

TEST_CASE(
    "gather_object and broadcast_object_list: ints, unsigned 64-bit, floats, strings, structs with a serialiser, "
    "ragged tensors",
    "[collectives]") {
  gloo_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  // Integers an IValue does not hold as they are (it holds int64): converted there and back.
  std::vector<int> ints;
  for (int q = 0; q < P; ++q) ints.insert(ints.end(), {q, -q});
  CHECK(acc.gather_object(std::vector<int>{r, -r}) == ints);
  const auto largest = std::numeric_limits<std::uint64_t>::max();
  const auto unsigned_values = acc.gather_object(largest - static_cast<std::uint64_t>(r));
  for (int q = 0; q < P; ++q) CHECK(unsigned_values[q] == largest - static_cast<std::uint64_t>(q));
  const auto floats = acc.gather_object(std::vector<float>{0.1f * static_cast<float>(r)});
  for (int q = 0; q < P; ++q) CHECK(floats[q] == 0.1f * static_cast<float>(q));
  const auto words = acc.gather_object(std::vector<std::string>(static_cast<std::size_t>(r), "w" + std::to_string(r)));
  CHECK(words.size() == static_cast<std::size_t>(P * (P - 1) / 2));  // lengths differ: 0, 1, ... P - 1
  CHECK((P < 3 || words.back() == "w" + std::to_string(P - 1)));
  // A user's struct with save/load members, whose tensor's shape differs between processes.
  const auto sample_of = [](int q) {
    return scored_sample{"sample " + std::to_string(q), q, torch::arange(q + 1, torch::kFloat)};
  };
  const auto samples = acc.gather_object(sample_of(r));
  REQUIRE(samples.size() == static_cast<std::size_t>(P));
  for (int q = 0; q < P; ++q) CHECK(samples[q] == sample_of(q));
  std::vector<scored_sample> broadcast{sample_of(r), sample_of(r)};
  acc.broadcast_object_list(broadcast, P - 1);
  CHECK(broadcast == std::vector<scored_sample>{sample_of(P - 1), sample_of(P - 1)});
  std::vector<int> numbers(static_cast<std::size_t>(r + 1), r);
  CHECK(acc.broadcast_object_list(numbers) == std::vector<int>{0});
  // Tensors of different shapes, which gather cannot concatenate: one element each, in process order.
  const auto ragged = acc.gather_object(std::vector<at::Tensor>{torch::full({r + 1}, r), torch::full({1, r + 2}, r)});
  REQUIRE(ragged.size() == static_cast<std::size_t>(2 * P));
  for (int q = 0; q < P; ++q) {
    CHECK(torch::equal(ragged[2 * q], torch::full({q + 1}, q)));
    CHECK(torch::equal(ragged[2 * q + 1], torch::full({1, q + 2}, q)));
  }
}

namespace {
/// Sample `i` of the ragged data set: `i % 3 + 1` elements, all `i`.
at::Tensor ragged_sample(std::int64_t i) { return torch::full({i % 3 + 1}, i, torch::kLong); }

/// The n samples made by `make`, in batches of b (the last one short).
template <class Make>
auto batches_of(std::int64_t n, std::int64_t b, Make make) {
  std::vector<std::vector<decltype(make(std::int64_t{0}))>> batches;
  for (std::int64_t start = 0; start < n; start += b) {
    batches.emplace_back();
    for (auto i = start; i < std::min(n, start + b); ++i) batches.back().push_back(make(i));
  }
  return batches;
}
}  // namespace

TEST_CASE(
    "gather_for_metrics of objects through even_batches padding: ragged tensors with use_gather_object, "
    "structs, ints, every sample once",
    "[data]") {
  gloo_accelerator acc;
  for (auto [n, b] : {std::pair<std::int64_t, std::int64_t>{10, 3}, {7, 2}, {13, 4}, {5, 4}, {24, 3}}) {
    INFO("N " << n << " B " << b);
    {  // per-sample tensors of different shapes: gather would need equal shapes
      auto batches = acc.prepare(batches_of(n, b, ragged_sample));
      std::vector<at::Tensor> seen;
      for (auto&& batch : batches) {
        auto gathered = acc.gather_for_metrics(batch, /*use_gather_object=*/true);
        seen.insert(seen.end(), gathered.begin(), gathered.end());
      }
      REQUIRE(seen.size() == static_cast<std::size_t>(n));  // the duplicated tail dropped
      for (std::int64_t i = 0; i < n; ++i) CHECK(torch::equal(seen[i], ragged_sample(i)));
    }
    {  // a user's struct with a serialiser (gather_object without asking: not tensors)
      const auto sample_of = [](std::int64_t i) {
        return scored_sample{"s" + std::to_string(i), i, torch::arange(i % 2 + 1)};
      };
      auto batches = acc.prepare(batches_of(n, b, sample_of));
      std::vector<scored_sample> seen;
      for (auto&& batch : batches) {
        auto gathered = acc.gather_for_metrics(batch);
        seen.insert(seen.end(), gathered.begin(), gathered.end());
      }
      REQUIRE(seen.size() == static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) CHECK(seen[i] == sample_of(i));
    }
    {  // ints: converted, every one once
      auto batches = acc.prepare(batches_of(n, b, [](std::int64_t i) { return static_cast<int>(i); }));
      std::vector<int> seen;
      for (auto&& batch : batches) {
        auto gathered = acc.gather_for_metrics(batch);
        seen.insert(seen.end(), gathered.begin(), gathered.end());
      }
      std::vector<int> all(static_cast<std::size_t>(n));
      std::iota(all.begin(), all.end(), 0);
      CHECK(seen == all);
    }
  }
}

TEST_CASE("find_executable_batch_size: process 1 alone runs out above 50; every process steps down with it to 46",
          "[memory_logging]") {
  gloo_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  REQUIRE(P >= 2);
  std::vector<int> tried;
  const auto sum = accel::find_executable_batch_size(
      acc,
      [&](int batch_size) {
        tried.push_back(batch_size);
        if (r == 1 && batch_size > 50) allocate_too_much();
        return torch::ones({batch_size, 4}).sum().item<double>();  // the others' attempts succeed
      },
      128);
  const std::vector<int> expected(j3_sizes.begin(), j3_sizes.begin() + 10);  // case J3's start, down to 46
  CHECK(tried == expected);
  CHECK(sum == 46 * 4);
  // The same on every process, as every process saw it.
  const auto all_tried = acc.gather_object(tried);
  REQUIRE(all_tried.size() == expected.size() * static_cast<std::size_t>(P));
  for (int process = 0; process < P; ++process)
    CHECK(std::vector<int>(all_tried.begin() + process * static_cast<std::ptrdiff_t>(expected.size()),
                           all_tried.begin() + (process + 1) * static_cast<std::ptrdiff_t>(expected.size())) ==
          expected);
}

TEST_CASE("find_executable_batch_size: an error other than out of memory on one process stops every process at once",
          "[memory_logging]") {
  gloo_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  const int failing = P - 1;
  std::vector<int> tried;
  auto search = [&] {
    return accel::find_executable_batch_size(
        acc,
        [&](int batch_size) {
          tried.push_back(batch_size);
          if (r == 0 && batch_size == 128) allocate_too_much();  // out of memory here, but P - 1's error decides
          if (r == failing && batch_size == 128) throw std::domain_error("a label out of range");
          return batch_size;
        },
        128);
  };
  if (r == failing)
    CHECK_THROWS_MATCHES(search(), std::domain_error, Catch::Message("a label out of range"));
  else
    CHECK_THROWS_WITH(search(), Catch::Contains("process " + std::to_string(failing) + " failed at batch size 128") &&
                                    Catch::Contains("other than running out of memory"));
  CHECK(tried == std::vector<int>{128});
  // The job goes on: every process left after the same collective.
  CHECK(torch::equal(acc.reduce(torch::ones({2})), torch::full({2}, P)));
}

// Issue 40, item 7: the final error names the last out-of-memory error; the process that had it nests it.
TEST_CASE("find_executable_batch_size: process 1 alone runs out at every size; it nests its error, the others name it",
          "[memory_logging]") {
  gloo_accelerator acc;
  const int r = acc.process_index();
  std::vector<int> tried;
  try {
    accel::find_executable_batch_size(
        acc,
        [&](int batch_size) {
          tried.push_back(batch_size);
          if (r == 1) allocate_too_much();
          return batch_size;
        },
        8, [](int size) { return size / 2; });
    FAIL("no error");
  } catch (const accel::batch_size_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("every batch size tried, from 8 down to 1, ran out of memory"));
    if (r == 1) {
      CHECK_THAT(e.what(), Catch::Contains("the last: at batch size 1, ") &&
                               Catch::Contains("DefaultCPUAllocator: can't allocate memory"));
      CHECK_THROWS_AS(std::rethrow_if_nested(e), c10::Error);
    } else {
      CHECK_THAT(e.what(), Catch::Contains("the last: process 1 at batch size 1 (that process reports it)"));
      CHECK_NOTHROW(std::rethrow_if_nested(e));
    }
  }
  CHECK(tried == std::vector<int>{8, 4, 2, 1});
}

TEST_CASE("get_logger: in_order lines come out in process order; main_process_only writes once", "[memory_logging]") {
  gloo_accelerator acc;  // the process group: the barrier in_order waits at
  const int P = acc.num_processes(), r = acc.process_index();
  const auto file = accel_test::job_directory("accel_logging_");
  if (acc.is_main_process()) std::filesystem::remove(file);
  acc.wait_for_everyone();
  {
    std::ofstream shared(file, std::ios::app);  // every process appends to the same file: its order is the writes'
    auto log = accel::get_logger("order", accel::log_level::info);
    log.set_stream(shared);
    for (const auto* round : {"first", "second"}) {
      // Process 0 starts late: only the barriers of in_order can still put its line first.
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      log.info(round, {.in_order = true});
    }
    log.info("once");
    log.info("everywhere", {.main_process_only = false});
    log.debug("below the level", {.main_process_only = false});
  }
  acc.wait_for_everyone();
  std::ifstream read(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(read, line);) lines.push_back(line);
  REQUIRE(lines.size() == static_cast<std::size_t>(3 * P + 1));
  std::size_t at = 0;
  for (const auto* round : {"first", "second"})
    for (int process = 0; process < P; ++process)
      CHECK(lines[at++] == "INFO:order:[RANK " + std::to_string(process) + "] " + round);
  // The rest in any order: "once" from process 0 alone, "everywhere" from each process.
  std::multiset<std::string> rest(lines.begin() + static_cast<std::ptrdiff_t>(at), lines.end());
  std::multiset<std::string> expected{"INFO:order:[RANK 0] once"};
  for (int process = 0; process < P; ++process)
    expected.insert("INFO:order:[RANK " + std::to_string(process) + "] everywhere");
  CHECK(rest == expected);
  acc.wait_for_everyone();
  if (acc.is_main_process()) std::filesystem::remove(file);
}
