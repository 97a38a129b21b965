// Sharded data parallelism on P = 2, 3 and 4 Gloo processes (tests/CMakeLists.txt): zero1, zero2 and fully_sharded
// against data_parallel, trained side by side in the same job from the same start on the same batches.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "support.hpp"

namespace {

using zero1 = accel::zero1<accel::gloo>;
using zero2 = accel::zero2<accel::gloo>;
using zero3 = accel::fully_sharded<accel::gloo>;

/// The model's full parameters, under any policy (fully_sharded holds slices between steps): get_state_dict's.
template <class Accelerator, class Model>
std::vector<torch::Tensor> full_parameters(Accelerator& acc, const Model& model) {
  std::vector<torch::Tensor> parameters;
  const auto count = acc.unwrap_model(model)->parameters().size();
  for (auto& [name, tensor] : acc.get_state_dict(model))
    if (parameters.size() < count) parameters.push_back(tensor);
  return parameters;
}

/// An MLP of uneven widths (13-7-5-3) and a one-element scale, so that at P = 4 some process owns nothing of it;
/// `extra` is used by every process but process 1 when `skip_extra_on_1`, and `frozen` never trains. With `Units`,
/// l1 and l2 are shard units of fully_sharded (l3, scale, extra and frozen outside any): the same parameters under
/// the same names, initialised alike.
template <bool Units>
struct uneven_impl_of : torch::nn::Module {
  using layer = std::conditional_t<Units, accel::shard_unit<torch::nn::Linear>, torch::nn::Linear>;
  explicit uneven_impl_of(bool skip_extra_on_1_) : skip_extra_on_1(skip_extra_on_1_) {
    l1 = register_module("l1", layer(torch::nn::Linear(13, 7)));
    l2 = register_module("l2", layer(torch::nn::Linear(7, 5)));
    l3 = register_module("l3", torch::nn::Linear(5, 3));
    scale = register_parameter("scale", torch::full({1}, 1.5));
    extra = register_parameter("extra", torch::full({3}, 0.25));
    frozen = register_parameter("frozen", torch::full({3}, 0.5), /*requires_grad=*/false);
  }
  torch::Tensor forward(const torch::Tensor& x, int rank) {
    auto y = l3(torch::tanh(l2(torch::tanh(l1(x))))) * scale + frozen;
    return skip_extra_on_1 && rank == 1 ? y : y + extra;
  }
  bool skip_extra_on_1;
  layer l1{nullptr}, l2{nullptr};
  torch::nn::Linear l3{nullptr};
  torch::Tensor scale, extra, frozen;
};
TORCH_MODULE_IMPL(uneven, uneven_impl_of<false>);
TORCH_MODULE_IMPL(uneven_units, uneven_impl_of<true>);

enum class optimizer_kind { adamw, adam, sgd_nesterov };

/// Two parameter groups with different learning rates and weight decay (the frozen parameter listed too, as users
/// list `parameters()`), picked by name (uneven's and uneven_units' are the same).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(optimizer_kind kind, torch::nn::Module& net) {
  const auto named = net.named_parameters();
  const auto pick = [&named](std::initializer_list<const char*> names) {
    std::vector<torch::Tensor> list;
    for (const auto* name : names) list.push_back(named[name]);
    return list;
  };
  const auto first = pick({"l1.weight", "l1.bias", "scale", "frozen"});
  const auto second = pick({"l2.weight", "l2.bias", "l3.weight", "l3.bias", "extra"});
  const auto groups = [&](auto make_options) {
    std::vector<torch::optim::OptimizerParamGroup> list;
    list.emplace_back(first, make_options(1e-2, 0.1));
    list.emplace_back(second, make_options(3e-3, 0.0));
    return list;
  };
  switch (kind) {
    case optimizer_kind::adamw:
      return std::make_unique<torch::optim::AdamW>(groups([](double lr, double wd) {
        return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(lr).weight_decay(wd));
      }));
    case optimizer_kind::adam:
      return std::make_unique<torch::optim::Adam>(groups([](double lr, double wd) {
        return std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(lr).weight_decay(wd));
      }));
    case optimizer_kind::sgd_nesterov:
      return std::make_unique<torch::optim::SGD>(
          groups([](double lr, double wd) {
            return std::make_unique<torch::optim::SGDOptions>(
                torch::optim::SGDOptions(lr).momentum(0.9).nesterov(true).weight_decay(wd));
          }),
          torch::optim::SGDOptions(0.1));
  }
  return nullptr;
}

struct run_result {
  std::vector<torch::Tensor> parameters;
  std::int64_t state_bytes = 0;  // of the optimizer's state tensors, on this process
};

/// Bytes of the state tensors `optimizer` holds (Adam's and AdamW's moments, SGD's momentum buffers).
std::int64_t state_bytes(torch::optim::Optimizer& optimizer) {
  std::int64_t bytes = 0;
  const auto add = [&bytes](const torch::Tensor& t) { bytes += t.defined() ? t.numel() * t.element_size() : 0; };
  for (auto& [key, state] : optimizer.state()) {
    if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
      add(adamw->exp_avg());
      add(adamw->exp_avg_sq());
      add(adamw->max_exp_avg_sq());
    } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
      add(adam->exp_avg());
      add(adam->exp_avg_sq());
      add(adam->max_exp_avg_sq());
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
      add(sgd->momentum_buffer());
    }
  }
  return bytes;
}

/// 20 optimizer steps of `Accelerator` from the same start on the same global batches, each process on its rows.
template <class Accelerator, class Model = uneven>
run_result train(optimizer_kind kind, bool skip_extra_on_1, int bucket_elements = 0, bool sync_each_batch = false,
                 const accel::sharding_options& sharding = {}) {
  const double bucket_mb = bucket_elements == 0 ? 25.0 : bucket_elements * 4.0 / (1024.0 * 1024.0);
  Accelerator acc(accel::options{.buckets = {.first_bucket_mb = bucket_mb, .bucket_cap_mb = bucket_mb},
                                 .sharding = sharding,
                                 .sync_each_batch = sync_each_batch});
  const int P = acc.num_processes(), r = acc.process_index();
  torch::manual_seed(5);
  Model net(skip_extra_on_1);
  auto optimizer = make_optimizer(kind, *net);
  auto [model, opt] = acc.prepare(net, *optimizer);
  const int micro_steps = acc.gradient_accumulation_steps();
  torch::manual_seed(11);
  for (int step = 0; step < 20 * micro_steps; ++step) {
    const auto x = torch::randn({4 * P, 13});
    const auto y = torch::randn({4 * P, 3});
    auto scope = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(x.narrow(0, 4 * r, 4), r), y.narrow(0, 4 * r, 4)));
    opt.step();
    opt.zero_grad();
  }
  run_result result;
  result.parameters = full_parameters(acc, model);
  result.state_bytes = state_bytes(*optimizer);
  return result;
}

/// Parameters trained under `Sharded` against data_parallel's: zero1 bit for bit (the same all-reduced gradients,
/// an elementwise update); zero2 bit for bit at P = 2 (a sum of two is the same in any order) and within the issue's
/// rtol 1.3e-6 / atol 1e-5 beyond (the reduce-scatter adds the processes' gradients in another order).
template <class Sharded>
void check_same_parameters(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& expected, int P,
                           bool bitwise_at_2 = true) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(Sharded::name() << ", parameter " << i << ", max difference "
                         << (got[i] - expected[i]).abs().max().item<double>());
    if (std::is_same_v<Sharded, zero1> || (P == 2 && bitwise_at_2))
      CHECK(torch::equal(got[i], expected[i]));
    else
      CHECK(torch::allclose(got[i], expected[i], 1.3e-6, 1e-5));
  }
}

/// With `Model` = uneven_units, data_parallel trains the units as plain modules and fully_sharded per unit.
template <class Precision, class Accumulation, class Sharded = zero1, class Model = uneven>
void check_parity(optimizer_kind kind, bool skip_extra_on_1, bool sync_each_batch = false,
                  const accel::sharding_options& sharding = {}) {
  using replicated = accel::accelerator<Precision, accel::data_parallel<accel::gloo>, Accumulation>;
  using sharded = accel::accelerator<Precision, Sharded, Accumulation>;
  const auto expected = train<replicated, Model>(kind, skip_extra_on_1, 0, sync_each_batch);
  const auto got = train<sharded, Model>(kind, skip_extra_on_1, 0, sync_each_batch, sharding);
  accel::accelerator<accel::fp32, Sharded> acc;
  // With sync_each_batch, data_parallel all-reduces the running sum (average so far + this micro-step's local
  // gradient) where zero2 adds each micro-step's reduced slice to its shard: equal sums, rounded differently.
  check_same_parameters<Sharded>(got.parameters, expected.parameters, acc.num_processes(), !sync_each_batch);
  torch::manual_seed(5);
  uneven start(skip_extra_on_1);
  CHECK_FALSE(torch::equal(got.parameters[0], start->parameters()[0]));  // it trained
}

const char* name_of(optimizer_kind kind) {
  return kind == optimizer_kind::adamw ? "AdamW" : kind == optimizer_kind::adam ? "Adam" : "SGD (Nesterov)";
}

}  // namespace

TEST_CASE("zero1 trains bit for bit as data_parallel: AdamW, Adam, SGD with Nesterov, two groups", "[sharded]") {
  const auto kind = GENERATE(optimizer_kind::adamw, optimizer_kind::adam, optimizer_kind::sgd_nesterov);
  INFO(name_of(kind));
  check_parity<accel::fp32, accel::no_accumulation>(kind, false);
}

TEST_CASE(
    "zero1 trains bit for bit as data_parallel with accumulate<4>, with bf16, with a parameter unused on "
    "process 1",
    "[sharded]") {
  check_parity<accel::fp32, accel::accumulate<4>>(optimizer_kind::adamw, false);
  check_parity<accel::bf16, accel::no_accumulation>(optimizer_kind::adamw, false);
  check_parity<accel::fp32, accel::no_accumulation>(optimizer_kind::adam, true);
}

TEMPLATE_TEST_CASE(
    "zero2 and fully_sharded train as data_parallel (bit for bit at P = 2): AdamW, Adam, SGD with "
    "Nesterov, two groups",
    "[sharded]", zero2, zero3) {
  const auto kind = GENERATE(optimizer_kind::adamw, optimizer_kind::adam, optimizer_kind::sgd_nesterov);
  INFO(TestType::name() << ", " << name_of(kind));
  check_parity<accel::fp32, accel::no_accumulation, TestType>(kind, false);
}

TEMPLATE_TEST_CASE(
    "zero2 and fully_sharded train as data_parallel with accumulate<4> (also reduce-scattering each batch), with "
    "bf16, with a parameter unused on process 1",
    "[sharded]", zero2, zero3) {
  check_parity<accel::fp32, accel::accumulate<4>, TestType>(optimizer_kind::adamw, false);
  check_parity<accel::fp32, accel::accumulate<4>, TestType>(optimizer_kind::adamw, false, /*sync_each_batch=*/true);
  check_parity<accel::bf16, accel::no_accumulation, TestType>(optimizer_kind::adamw, false);
  check_parity<accel::fp32, accel::no_accumulation, TestType>(optimizer_kind::adam, true);
}

TEMPLATE_TEST_CASE("each process's optimizer state is its shard, 8 bytes per owned element with AdamW", "[sharded]",
                   zero1, zero2, zero3) {
  using replicated = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
  using sharded = accel::accelerator<accel::fp32, TestType>;
  const auto whole = train<replicated>(optimizer_kind::adamw, false);
  const auto mine = train<sharded>(optimizer_kind::adamw, false);
  accel::accelerator<accel::fp32, TestType> acc;
  const int P = acc.num_processes(), r = acc.process_index();
  uneven net(false);
  std::int64_t trainable = 0, owned = 0, ceiling = 0;
  for (const auto& p : net->parameters()) {
    if (!p.requires_grad()) continue;
    trainable += p.numel();
    owned += accel::detail::shard_span_of(p.numel(), r, P).length;
    ceiling += (p.numel() + P - 1) / P;
  }
  INFO("process " << r << " of " << P << ": " << mine.state_bytes << " bytes of state, data_parallel "
                  << whole.state_bytes);
  CHECK(whole.state_bytes == 8 * trainable);
  CHECK(mine.state_bytes == 8 * owned);
  CHECK(mine.state_bytes <= 8 * ceiling);
  // The shards partition the state: the processes' bytes add up to data_parallel's.
  auto total = torch::tensor({static_cast<double>(mine.state_bytes)}, torch::kDouble);
  CHECK(acc.reduce(total, accel::reduction::sum).template item<double>() == static_cast<double>(whole.state_bytes));
}

TEST_CASE("zero1 communicates one all-reduce and one all-gather per bucket per step", "[sharded]") {
  accel::accelerator<accel::fp32, accel::zero1<accel::gloo>> acc(
      accel::options{.buckets = {.first_bucket_mb = 0.0001, .bucket_cap_mb = 0.0001}});  // ~26 elements a bucket
  const int P = acc.num_processes(), r = acc.process_index();
  torch::manual_seed(5);
  uneven net(false);
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2));
  auto [model, opt] = acc.prepare(net, adamw);
  auto* shards = acc.parallel().shards_of(adamw);
  REQUIRE(shards != nullptr);
  const auto buckets = acc.parallel().reducer_for(*net)->bucket_layout().size();
  CHECK(buckets >= 3);
  CHECK(shards->bucket_count() >= 3);
  for (int step = 0; step < 5; ++step) {
    acc.backward(torch::mse_loss(model(torch::randn({4, 13}), r), torch::randn({4, 3})));
    opt.step();
    opt.zero_grad();
  }
  CHECK(acc.parallel().reducer_for(*net)->all_reduce_count() == 5 * buckets);
  CHECK(shards->all_gather_count() == 5 * shards->bucket_count());
  // Every process ends with the same full parameters.
  for (const auto& p : net->parameters()) {
    const auto all = acc.gather(p.detach().reshape({1, -1}));
    for (int other = 1; other < P; ++other) CHECK(torch::equal(all[other], all[0]));
  }
}

TEST_CASE(
    "zero2 and fully_sharded communicate one reduce-scatter and one all-gather per bucket per step, carrying what "
    "data_parallel all-reduces",
    "[sharded]") {
  // ~26 elements a bucket, so that there are several
  const accel::bucket_options buckets{.first_bucket_mb = 0.0001, .bucket_cap_mb = 0.0001};
  const auto run = [&buckets]<class Policy>(std::type_identity<Policy>) {
    accel::accelerator<accel::fp32, Policy> acc(accel::options{.buckets = buckets});
    const int r = acc.process_index();
    torch::manual_seed(5);
    uneven net(false);
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2));
    auto [model, opt] = acc.prepare(net, adamw);
    for (int step = 0; step < 5; ++step) {
      acc.backward(torch::mse_loss(model(torch::randn({4, 13}), r), torch::randn({4, 3})));
      opt.step();
      opt.zero_grad();
    }
    auto* reducer = acc.parallel().reducer_for(*net);
    const auto bucket_count = reducer->bucket_layout().size();
    CHECK(bucket_count >= 3);
    std::uint64_t gathered = 0;
    if constexpr (!std::is_same_v<Policy, accel::data_parallel<accel::gloo>>) {  // fully_sharded: per forward
      auto* shards = acc.parallel().shards_of(adamw);
      CHECK(reducer->reduce_scatter_count() == 5 * bucket_count);
      CHECK(shards->all_gather_count() == 5 * shards->bucket_count());
      gathered = 5 * static_cast<std::uint64_t>(shards->gather_payload_elements());
    } else {
      CHECK(reducer->all_reduce_count() == 5 * bucket_count);
    }
    // Every process ends with the same full parameters.
    for (const auto& p : full_parameters(acc, model)) {
      const auto all = acc.gather(p.reshape({1, -1}));
      for (int other = 1; other < acc.num_processes(); ++other) CHECK(torch::equal(all[other], all[0]));
    }
    return std::pair{reducer->payload_elements(), gathered};
  };
  const auto [all_reduced, nothing] = run(std::type_identity<accel::data_parallel<accel::gloo>>{});
  const auto [reduce_scattered, gathered] = run(std::type_identity<zero2>{});
  // fully_sharded gathers before each forward what zero2 gathers after each step: the same collectives.
  CHECK(run(std::type_identity<zero3>{}) == std::pair{reduce_scattered, gathered});
  // A ring moves (P-1)/P of what a reduce-scatter or an all-gather is given, and twice that for an all-reduce: the
  // same bytes when reduce-scattered + all-gathered == 2 x all-reduced. Here the difference is the padding to equal
  // chunks (and the "used" flags, one per parameter in each of P segments), and nothing more.
  accel::accelerator<accel::fp32, zero2> acc;
  const auto P = static_cast<std::uint64_t>(acc.num_processes());
  uneven net(false);
  std::uint64_t padding = 0, parameters = 0;
  for (const auto& p : net->parameters())
    if (p.requires_grad()) {
      padding += P * static_cast<std::uint64_t>(accel::detail::shard_chunk(p.numel(), P)) - p.numel();
      ++parameters;
    }
  const std::uint64_t flags_all_reduced = 5 * parameters, flags_reduce_scattered = 5 * P * parameters;
  INFO("all-reduced " << all_reduced << ", reduce-scattered " << reduce_scattered << ", all-gathered " << gathered
                      << " elements over 5 steps; padding per step " << padding);
  CHECK(reduce_scattered == all_reduced - flags_all_reduced + 5 * padding + flags_reduce_scattered);
  CHECK(gathered == all_reduced - flags_all_reduced + 5 * padding);
}

TEMPLATE_TEST_CASE("get_state_dict: the full weights on every process, those data_parallel trains", "[sharded]", zero1,
                   zero2, zero3) {
  const auto state_after_training = []<class Policy>(std::type_identity<Policy>) {
    accel::accelerator<accel::fp32, Policy> acc;
    const int P = acc.num_processes(), r = acc.process_index();
    torch::manual_seed(5);
    uneven net(false);
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2));
    auto [model, opt] = acc.prepare(net, adamw);
    torch::manual_seed(11);
    for (int step = 0; step < 3; ++step) {
      const auto x = torch::randn({4 * P, 13}), y = torch::randn({4 * P, 3});
      acc.backward(torch::mse_loss(model(x.narrow(0, 4 * r, 4), r), y.narrow(0, 4 * r, 4)));
      opt.step();
      opt.zero_grad();
    }
    auto state = acc.get_state_dict(model);
    for (const auto& [name, tensor] : state) {  // the same on every process
      const auto all = acc.gather(tensor.reshape({1, -1}));
      for (int other = 1; other < P; ++other) CHECK(torch::equal(all[other], all[0]));
    }
    return state;
  };
  const auto expected = state_after_training(std::type_identity<accel::data_parallel<accel::gloo>>{});
  const auto got = state_after_training(std::type_identity<TestType>{});
  REQUIRE(got.size() == expected.size());
  accel::accelerator<accel::fp32, TestType> acc;
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(got[i].first);
    CHECK(got[i].first == expected[i].first);
    if (std::is_same_v<TestType, zero1> || acc.num_processes() == 2)
      CHECK(torch::equal(got[i].second, expected[i].second));
    else
      CHECK(torch::allclose(got[i].second, expected[i].second, 1.3e-6, 1e-5));
  }
}

TEMPLATE_TEST_CASE("the global gradient norm on every process, and clipping to it", "[sharded]", zero1, zero2, zero3) {
  const double norm_type = GENERATE(2.0, 3.0, std::numeric_limits<double>::infinity());
  INFO("norm type " << norm_type);
  using replicated = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
  using sharded = accel::accelerator<accel::fp32, TestType>;
  const auto run = [norm_type]<class Accelerator>(std::type_identity<Accelerator>) {
    Accelerator acc;
    const int P = acc.num_processes(), r = acc.process_index();
    torch::manual_seed(5);
    uneven net(false);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    auto [model, opt] = acc.prepare(net, sgd);
    torch::manual_seed(11);
    const auto x = torch::randn({4 * P, 13}), y = torch::randn({4 * P, 3});
    acc.backward(torch::mse_loss(model(x.narrow(0, 4 * r, 4), r), y.narrow(0, 4 * r, 4)) * 100);
    const double norm = acc.clip_grad_norm_(net->parameters(), 0.5, norm_type);
    opt.step();
    return std::pair{norm, full_parameters(acc, model)};
  };
  const auto [expected_norm, expected] = run(std::type_identity<replicated>{});
  const auto [norm, got] = run(std::type_identity<sharded>{});
  CHECK(expected_norm > 0.5);  // the clipping acts
  CHECK(norm == Approx(expected_norm).epsilon(1e-6));
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(torch::allclose(got[i], expected[i], 1e-6, 1e-7));
}

namespace {

/// Steps [first, last) of a run (each step's batch seeded by its number, so a resumed run sees the same batches),
/// after loading `load_from` and before saving into `save_to` when they are given.
template <class Accelerator, class Model = uneven>
std::vector<torch::Tensor> run_steps(int first, int last, int init_seed, const std::filesystem::path& load_from = {},
                                     const std::filesystem::path& save_to = {}, const accel::options& opts = {}) {
  Accelerator acc(opts);
  const int P = acc.num_processes(), r = acc.process_index();
  torch::manual_seed(init_seed);
  Model net(false);
  auto optimizer = make_optimizer(optimizer_kind::adamw, *net);
  auto [model, opt] = acc.prepare(net, *optimizer);
  if (!load_from.empty()) acc.load_state(load_from);
  for (int step = first; step < last; ++step) {
    torch::manual_seed(1000 + step);
    const auto x = torch::randn({4 * P, 13}), y = torch::randn({4 * P, 3});
    acc.backward(torch::mse_loss(model(x.narrow(0, 4 * r, 4), r), y.narrow(0, 4 * r, 4)));
    opt.step();
    opt.zero_grad();
  }
  if (!save_to.empty()) acc.save_state(save_to);
  return full_parameters(acc, model);
}

/// Options that make the sharded policies write sharded checkpoints.
const accel::options sharded_files{.sharding = {.state_dict = accel::state_dict_type::sharded}};

}  // namespace

namespace {
/// 10 steps == 5, save, load into other objects, 5 more, bit for bit, under `Sharded` (with `Model`); a checkpoint
/// holds the whole optimizer state, so data_parallel (with the model without units) resumes from it, and `Sharded`
/// from data_parallel's, each as if the other had trained all along (bit for bit where the policies train alike:
/// check_same_parameters).
template <class Sharded, class Model = uneven>
void check_resume_across_policies(const std::string& stem) {
  using sharded = accel::accelerator<accel::fp32, Sharded>;
  using replicated = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
  const auto dir = accel_test::job_directory(stem + "resume_");
  const auto replicated_dir = accel_test::job_directory(stem + "replicated_");
  const auto uninterrupted = run_steps<sharded, Model>(0, 10, 5);
  run_steps<sharded, Model>(0, 5, 5, {}, dir);
  const auto resumed = run_steps<sharded, Model>(5, 10, 99, dir);
  for (std::size_t i = 0; i < resumed.size(); ++i) CHECK(torch::equal(resumed[i], uninterrupted[i]));
  // The same files as data_parallel's: the optimizer's whole state in optimizer.bin.
  CHECK(std::filesystem::exists(dir / "optimizer.bin"));
  const auto replicated_uninterrupted = run_steps<replicated>(0, 10, 5);
  const auto replicated_from_sharded = run_steps<replicated>(5, 10, 99, dir);
  run_steps<replicated>(0, 5, 5, {}, replicated_dir);
  const auto sharded_from_replicated = run_steps<sharded, Model>(5, 10, 99, replicated_dir);
  sharded acc;
  INFO("data_parallel resumed from " << Sharded::name() << "'s checkpoint");
  check_same_parameters<Sharded>(replicated_from_sharded, replicated_uninterrupted, acc.num_processes());
  INFO(Sharded::name() << " resumed from data_parallel's checkpoint");
  check_same_parameters<Sharded>(sharded_from_replicated, uninterrupted, acc.num_processes());
  acc.wait_for_everyone();
  if (acc.is_main_process()) {
    accel::detail::remove_tree(dir);
    accel::detail::remove_tree(replicated_dir);
  }
}
}  // namespace

TEMPLATE_TEST_CASE(
    "resumes bit for bit: 10 steps == 5, save, load into other objects, 5 more; a checkpoint holds the whole "
    "optimizer state, so it moves between data_parallel and the sharded policies",
    "[sharded]", zero1, zero2, zero3) {
  check_resume_across_policies<TestType>("accel_sharded_");
}

TEMPLATE_TEST_CASE(
    "a sharded checkpoint: each process writes its own slices and nothing is gathered; it resumes bit for bit, "
    "loads under data_parallel, and merge_weights gives the full weights",
    "[sharded]", zero1, zero2, zero3) {
  using sharded = accel::accelerator<accel::fp32, TestType>;
  using replicated = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
  const auto dir = accel_test::job_directory("accel_sharded_files_");
  const auto merged = accel_test::job_directory("accel_merged_");
  const auto uninterrupted = run_steps<sharded>(0, 10, 5);
  const auto saved = run_steps<sharded>(0, 5, 5, {}, dir, sharded_files);
  const auto resumed = run_steps<sharded>(5, 10, 99, dir, {}, sharded_files);
  for (std::size_t i = 0; i < resumed.size(); ++i) CHECK(torch::equal(resumed[i], uninterrupted[i]));
  sharded acc;
  const int P = acc.num_processes(), r = acc.process_index();
  CHECK(std::filesystem::exists(dir / "shard_layout.bin"));
  CHECK_FALSE(std::filesystem::exists(dir / "model.safetensors"));
  for (int q = 0; q < P; ++q) {
    CHECK(std::filesystem::exists(dir / ("model_shard_" + std::to_string(q) + ".safetensors")));
    CHECK(std::filesystem::exists(dir / ("optimizer_shard_" + std::to_string(q) + ".safetensors")));
  }
  // This process's file holds its slice of each trainable parameter, and process 0's the frozen one whole.
  std::map<std::string, torch::Tensor> mine;
  for (auto& [name, tensor] : accel::safetensors::load(dir / ("model_shard_" + std::to_string(r) + ".safetensors")))
    mine.emplace(name, tensor);
  uneven net(false);
  for (const auto& item : net->named_parameters()) {
    INFO(item.key());
    if (item.value().requires_grad()) {
      REQUIRE(mine.contains(item.key()));
      CHECK(mine[item.key()].numel() == accel::detail::shard_span_of(item.value().numel(), r, P).length);
    } else {
      CHECK(mine.contains(item.key()) == (r == 0));
    }
  }
  // data_parallel resumes from it as if it had trained all along.
  const auto replicated_from_sharded = run_steps<replicated>(5, 10, 99, dir);
  check_same_parameters<TestType>(replicated_from_sharded, run_steps<replicated>(0, 10, 5), P);
  acc.wait_for_everyone();
  if (acc.is_main_process()) {
    const auto files = accel::merge_weights(dir, merged);
    REQUIRE(files.size() == 1);
    const auto weights = accel::safetensors::load(files.front());
    REQUIRE(weights.size() == saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i) CHECK(torch::equal(weights[i].second, saved[i]));
    accel::detail::remove_tree(dir);
    accel::detail::remove_tree(merged);
  }
}

TEST_CASE("fully_sharded writes a sharded checkpoint without gathering anything, a full one by gathering",
          "[sharded]") {
  const auto gathers_of_a_save = [](const accel::options& opts) {
    accel::accelerator<accel::fp32, zero3> acc(opts);
    torch::manual_seed(5);
    uneven net(false);
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2));
    auto [model, opt] = acc.prepare(net, adamw);
    acc.backward(torch::mse_loss(model(torch::randn({4, 13}), acc.process_index()), torch::randn({4, 3})));
    opt.step();
    opt.zero_grad();
    const auto* shards = acc.parallel().shards_of(adamw);
    const auto before = shards->all_gather_count();
    const auto dir = accel_test::job_directory("accel_gathers_of_a_save_");
    acc.save_state(dir);
    const auto gathers = shards->all_gather_count() - before;
    acc.wait_for_everyone();
    if (acc.is_main_process()) accel::detail::remove_tree(dir);
    return gathers;
  };
  CHECK(gathers_of_a_save(sharded_files) == 0u);
  CHECK(gathers_of_a_save({}) > 0u);  // the full format gathers the parameters (and the state)
}

namespace {
/// Where the jobs of the resume-elsewhere cases meet (tests/CMakeLists.txt sets it).
std::filesystem::path cross_job_directory(const std::string& policy) {
  const char* dir = std::getenv("ACCEL_TEST_CROSS_JOB_DIR");
  REQUIRE(dir != nullptr);
  return std::filesystem::path(dir) / policy;
}
/// The AdamW state a checkpoint holds for the uneven MLP.
std::vector<torch::Tensor> saved_adamw_state(const std::filesystem::path& checkpoint) {
  uneven net(false);
  auto optimizer = make_optimizer(optimizer_kind::adamw, *net);
  return accel_test::adamw_state(*optimizer, checkpoint / "optimizer.bin");
}
}  // namespace

TEMPLATE_TEST_CASE("saved by 2 processes under a sharded policy, for jobs of another number of processes to load",
                   "[resume_elsewhere_save]", zero1, zero2, zero3) {
  using sharded = accel::accelerator<accel::fp32, TestType>;
  const auto dir = cross_job_directory(TestType::name());
  run_steps<sharded>(0, 5, 5, {}, dir);
  // The same training, saved in the sharded format: each process's slices.
  run_steps<sharded>(0, 5, 5, {}, cross_job_directory(TestType::name() + "_sharded"), sharded_files);
  sharded acc;
  REQUIRE(acc.num_processes() == 2);
}

TEMPLATE_TEST_CASE(
    "a sharded checkpoint saved by 2 processes loads under another number of processes: the saved parameters and "
    "optimizer state, bit for bit, and training goes on as data_parallel's from it",
    "[resume_elsewhere_load]", zero1, zero2, zero3) {
  using sharded = accel::accelerator<accel::fp32, TestType>;
  using replicated = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
  const auto dir = cross_job_directory(TestType::name() + "_sharded");
  const auto full = cross_job_directory(TestType::name());  // the same state, saved whole
  const auto again = accel_test::job_directory("accel_sharded_saved_again_");
  // Loaded from the shard files of 2 processes, saved again whole: the state the 2 processes saved whole.
  const auto loaded = run_steps<sharded>(5, 5, 99, dir, again);
  const auto copied = run_steps<replicated>(5, 5, 99, full);
  for (std::size_t i = 0; i < loaded.size(); ++i) CHECK(torch::equal(loaded[i], copied[i]));
  CHECK(accel_test::all_equal(saved_adamw_state(again), saved_adamw_state(full)));
  const auto trained = run_steps<sharded>(5, 8, 99, dir);
  const auto expected = run_steps<replicated>(5, 8, 99, dir);
  sharded acc;
  check_same_parameters<TestType>(trained, expected, acc.num_processes());
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(again);
}

TEMPLATE_TEST_CASE(
    "loaded by another number of processes, a sharded policy holds the saved parameters and optimizer state, bit for "
    "bit, and trains on as data_parallel does from the same checkpoint",
    "[resume_elsewhere_load]", zero1, zero2, zero3) {
  using sharded = accel::accelerator<accel::fp32, TestType>;
  using replicated = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
  const auto dir = cross_job_directory(TestType::name());
  const auto again = accel_test::job_directory("accel_saved_again_");
  // Loaded and saved again at once: each process's shard, gathered whole, is what the 2 processes saved.
  const auto loaded = run_steps<sharded>(5, 5, 99, dir, again);
  const auto copied = run_steps<replicated>(5, 5, 99, dir);
  for (std::size_t i = 0; i < loaded.size(); ++i) CHECK(torch::equal(loaded[i], copied[i]));
  const auto saved_state = saved_adamw_state(dir);
  CHECK_FALSE(saved_state.empty());
  CHECK(accel_test::all_equal(saved_adamw_state(again), saved_state));
  // Steps 5 to 8 under this number of processes, sharded and replicated.
  const auto trained = run_steps<sharded>(5, 8, 99, dir);
  const auto expected = run_steps<replicated>(5, 8, 99, dir);
  sharded acc;
  check_same_parameters<TestType>(trained, expected, acc.num_processes());
  CHECK_FALSE(torch::equal(trained[0], loaded[0]));  // it trained
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(again);
}

namespace {

/// 64 layers of 128 x 128: 1,056,768 parameters, none larger than 16,384 elements, so that the optimizer's state
/// dominates and what scales with one parameter or one bucket (the step's temporaries, the collective's own
/// staging) stays within a few percent of it. With `units`, each layer is a shard unit.
torch::nn::Sequential deep_narrow_mlp(bool units = false) {
  torch::manual_seed(4);
  torch::nn::Sequential net;
  for (int i = 0; i < 64; ++i)
    if (units)
      net->push_back(accel::shard_unit(torch::nn::Linear(128, 128)));
    else
      net->push_back(torch::nn::Linear(128, 128));
  return net;
}

/// Bytes of CPU storage allocated now, counted by accel (`accel::count_cpu_memory()`, turned on at the first call),
/// once the count has stopped changing for `quiet` (waiting 2 s at most): Gloo's worker thread lets go of a finished
/// collective's tensors just after the wait for it returns, so their storage may count for a moment.
std::int64_t settled_cpu_bytes(std::chrono::milliseconds quiet = std::chrono::milliseconds(20)) {
  accel::count_cpu_memory();
  const auto allocated = [] { return accel::memory_stats(c10::Device(c10::kCPU)).allocated; };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  auto last = allocated();
  auto since = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < deadline && std::chrono::steady_clock::now() - since < quiet) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (const auto now = allocated(); now != last) {
      last = now;
      since = std::chrono::steady_clock::now();
    }
  }
  return last;
}

/// The peak bytes of CPU storage allocated during the third AdamW step of `Accelerator`, above what was allocated
/// before the run began (the first two steps allocate the optimizer state and the buffers kept between steps).
template <class Accelerator>
std::int64_t peak_step_bytes(const accel::bucket_options& buckets, bool units = false) {
  const auto before = settled_cpu_bytes();  // not counting what an earlier test's collective is just letting go of
  std::int64_t peak = 0;
  {
    Accelerator acc(accel::options{.buckets = buckets});
    auto net = deep_narrow_mlp(units);
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
    auto [model, opt] = acc.prepare(net, adamw);
    torch::manual_seed(7 + acc.process_index());
    const auto x = torch::randn({8, 128});
    for (int step = 0; step < 3; ++step) {
      if (step == 2) accel::reset_peak_memory_stats(c10::Device(c10::kCPU));
      acc.backward(model(x).pow(2).mean());
      opt.step();
      opt.zero_grad();
    }
    peak = accel::memory_stats(c10::Device(c10::kCPU)).peak_allocated - before;
  }
  return peak;
}

}  // namespace

TEST_CASE("zero1 saves what the memory formula says: peak CPU bytes of a step, counted", "[sharded]") {
  const accel::bucket_options buckets{.first_bucket_mb = 0.125, .bucket_cap_mb = 0.125};
  const auto replicated = peak_step_bytes<accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>>(buckets);
  const auto sharded = peak_step_bytes<accel::accelerator<accel::fp32, accel::zero1<accel::gloo>>>(buckets);
  // The formula (docs/sharded.md): the state falls from 8 n to 8 x (elements owned here), and the all-gather keeps
  // one bucket's buffers, P + 1 shards of it.
  accel::accelerator<accel::fp32, accel::zero1<accel::gloo>> acc(accel::options{.buckets = buckets});
  const int P = acc.num_processes(), r = acc.process_index();
  auto net = deep_narrow_mlp();
  std::int64_t n = 0, owned = 0;
  for (const auto& p : net->parameters()) {
    n += p.numel();
    owned += accel::detail::shard_span_of(p.numel(), r, P).length;
  }
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto prepared = acc.prepare(net, adamw);
  const auto buffers = acc.parallel().shards_of(adamw)->gather_buffer_elements() * 4;
  const auto predicted = 8 * n - 8 * owned - buffers;
  INFO("process " << r << " of " << P << ": data_parallel peak " << replicated << " B, zero1 " << sharded
                  << " B, saved " << replicated - sharded << " B, predicted " << predicted << " B (state "
                  << 8 * (n - owned) << ", gather buffers " << buffers << ")");
  CHECK(predicted > 0);
  CHECK(std::abs(static_cast<double>(replicated - sharded - predicted)) <= 0.05 * static_cast<double>(predicted));
}

namespace {

/// Elements of each of `net`'s gradient buckets under zero2 (what one process hands the reduce-scatter: P segments
/// of each member's chunk and a "used" flag per member).
std::vector<std::int64_t> sharded_bucket_elements(accel::accelerator<accel::fp32, zero2>& acc, torch::nn::Module& net) {
  const int P = acc.num_processes();
  const auto parameters = net.parameters();
  std::vector<std::int64_t> elements;
  for (const auto& members : acc.parallel().reducer_for(net)->bucket_layout()) {
    std::int64_t segment = static_cast<std::int64_t>(members.size());
    for (auto i : members) segment += accel::detail::shard_chunk(parameters[i].numel(), P);
    elements.push_back(P * segment);
  }
  return elements;
}

/// What zero2 saves against data_parallel at the peak of a step (docs/sharded.md): data_parallel holds 4 n of
/// persistent buckets and 4 n of gradients that zero2 does not; zero2 holds its segments, the all-gather's buffers
/// and, during backward, at most three buckets at once (one filling, two reduce-scattering) and the two
/// reduce-scatters' receive buffers, a bucket each.
std::int64_t zero2_peak_saving(const accel::bucket_options& buckets) {
  accel::accelerator<accel::fp32, zero2> acc(accel::options{.buckets = buckets});
  const int P = acc.num_processes(), r = acc.process_index();
  auto net = deep_narrow_mlp();
  std::int64_t n = 0, owned = 0;
  for (const auto& p : net->parameters()) {
    n += p.numel();
    owned += accel::detail::shard_span_of(p.numel(), r, P).length;
  }
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto prepared = acc.prepare(net, adamw);
  std::int64_t segments = 0, largest_bucket = 0;
  for (auto elements : sharded_bucket_elements(acc, *net)) {
    segments += elements / P;
    largest_bucket = std::max(largest_bucket, elements);
  }
  const auto gather_buffers = acc.parallel().shards_of(adamw)->gather_buffer_elements() * 4;
  const auto replicated_buckets = 4 * (n + static_cast<std::int64_t>(net->parameters().size()));
  return replicated_buckets + 4 * n + 8 * n - (8 * owned + gather_buffers + 4 * segments + 5 * 4 * largest_bucket);
}

}  // namespace

TEST_CASE("zero2 keeps one shard of the gradients after backward, and saves what the memory formula says",
          "[sharded]") {
  const accel::bucket_options buckets{.first_bucket_mb = 0.125, .bucket_cap_mb = 0.125};
  // Peak bytes of a step (measured first, before anything else of this test is allocated).
  const auto replicated_peak =
      peak_step_bytes<accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>>(buckets);
  const auto sharded_peak = peak_step_bytes<accel::accelerator<accel::fp32, zero2>>(buckets);

  // Bytes of CPU storage that the third backward allocated and left allocated: the gradients kept for the step.
  const auto kept_by_backward = [&]<class Policy>(std::type_identity<Policy>) {
    accel::accelerator<accel::fp32, Policy> acc(accel::options{.buckets = buckets});
    auto net = deep_narrow_mlp();
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
    auto [model, opt] = acc.prepare(net, adamw);
    torch::manual_seed(7 + acc.process_index());
    const auto x = torch::randn({8, 128});
    std::int64_t kept = 0;
    for (int step = 0; step < 3; ++step) {
      const auto before = settled_cpu_bytes();
      acc.backward(model(x).pow(2).mean());
      kept = settled_cpu_bytes() - before;
      opt.step();
      opt.zero_grad();
    }
    return kept;
  };
  accel::accelerator<accel::fp32, zero2> acc(accel::options{.buckets = buckets});
  const int P = acc.num_processes(), r = acc.process_index();
  auto net = deep_narrow_mlp();
  std::int64_t n = 0, owned = 0, shard = 0;
  for (const auto& p : net->parameters()) {
    n += p.numel();
    owned += accel::detail::shard_span_of(p.numel(), r, P).length;
    shard += accel::detail::shard_chunk(p.numel(), P);
  }
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto prepared = acc.prepare(net, adamw);
  const auto bucket_elements = sharded_bucket_elements(acc, *net);
  std::int64_t segments = 0, largest_bucket = 0;
  for (auto elements : bucket_elements) {
    segments += elements / P;
    largest_bucket = std::max(largest_bucket, elements);
  }
  const auto replicated_kept = kept_by_backward(std::type_identity<accel::data_parallel<accel::gloo>>{});
  const auto sharded_kept = kept_by_backward(std::type_identity<zero2>{});
  INFO("process " << r << " of " << P << ": backward kept " << replicated_kept << " B under data_parallel, "
                  << sharded_kept << " B under zero2; one shard is " << 4 * shard << " B, one bucket "
                  << 4 * largest_bucket << " B");
  CHECK(replicated_kept >= 4 * n);                        // the full gradients
  CHECK(sharded_kept >= 4 * owned);                       // this process's slices
  CHECK(sharded_kept <= 4 * shard + 4 * largest_bucket);  // the bound: one shard plus one bucket
  CHECK(sharded_kept == 4 * segments);                    // exactly: this process's segment of each bucket

  const auto predicted = zero2_peak_saving(buckets);
  INFO("peak: data_parallel " << replicated_peak << " B, zero2 " << sharded_peak << " B, saved "
                              << replicated_peak - sharded_peak << " B, predicted " << predicted << " B");
  CHECK(std::abs(static_cast<double>(replicated_peak - sharded_peak - predicted)) <=
        0.05 * static_cast<double>(predicted));
}

TEST_CASE(
    "fully_sharded: between steps each process holds only its slices of the parameters, whole from forward to step; "
    "get_state_dict leaves them so, free_memory makes them whole",
    "[sharded]") {
  accel::accelerator<accel::fp32, zero3> acc;
  const int P = acc.num_processes(), r = acc.process_index();
  torch::manual_seed(5);
  uneven net(false);
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& p : net->parameters()) shapes.push_back(p.sizes().vec());
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2));
  auto [model, opt] = acc.prepare(net, adamw);
  std::int64_t shard = 0;
  for (const auto& shape : shapes) shard += accel::detail::shard_chunk(c10::multiply_integers(shape), P);
  const auto check_at_rest = [&] {
    std::int64_t bytes = 0;
    const auto parameters = net->parameters();
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      const auto& p = parameters[i];
      if (!p.requires_grad()) {  // frozen: whole, replicated
        CHECK(p.sizes().vec() == shapes[i]);
        continue;
      }
      const auto numel = c10::multiply_integers(shapes[i]);
      CHECK(p.dim() == 1);
      CHECK(p.numel() == accel::detail::shard_span_of(numel, r, P).length);
      bytes += p.numel() * p.element_size();
    }
    INFO("parameter bytes at rest " << bytes << ", one shard " << 4 * shard);
    CHECK(bytes <= 4 * shard);  // the bound
  };
  const auto check_whole = [&] {
    const auto parameters = net->parameters();
    for (std::size_t i = 0; i < parameters.size(); ++i) CHECK(parameters[i].sizes().vec() == shapes[i]);
  };
  check_at_rest();
  for (int step = 0; step < 3; ++step) {
    const auto loss = torch::mse_loss(model(torch::randn({4, 13}), r), torch::randn({4, 3}));
    check_whole();
    acc.backward(loss);
    check_whole();
    opt.step();
    opt.zero_grad();
    check_at_rest();
  }
  const auto full = full_parameters(acc, model);
  check_at_rest();
  acc.free_memory();
  check_whole();
  const auto parameters = net->parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) CHECK(torch::equal(parameters[i], full[i]));
}

TEST_CASE("fully_sharded saves what the memory formula says: bytes between steps and peak bytes of a step, counted",
          "[sharded]") {
  const accel::bucket_options buckets{.first_bucket_mb = 0.125, .bucket_cap_mb = 0.125};
  const auto replicated_peak =
      peak_step_bytes<accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>>(buckets);
  const auto sharded_peak = peak_step_bytes<accel::accelerator<accel::fp32, zero3>>(buckets);
  // Bytes of CPU storage held after the third step, the model included.
  const auto held_between_steps = [&]<class Policy>(std::type_identity<Policy>) {
    const auto before = settled_cpu_bytes();
    accel::accelerator<accel::fp32, Policy> acc(accel::options{.buckets = buckets});
    auto net = deep_narrow_mlp();
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
    auto [model, opt] = acc.prepare(net, adamw);
    torch::manual_seed(7 + acc.process_index());
    const auto x = torch::randn({8, 128});
    for (int step = 0; step < 3; ++step) {
      acc.backward(model(x).pow(2).mean());
      opt.step();
      opt.zero_grad();
    }
    return settled_cpu_bytes() - before;
  };
  const auto zero2_held = held_between_steps(std::type_identity<zero2>{});
  const auto zero3_held = held_between_steps(std::type_identity<zero3>{});
  const auto zero2_saving = zero2_peak_saving(buckets);
  accel::accelerator<accel::fp32, zero3> acc;
  const int P = acc.num_processes(), r = acc.process_index();
  auto net = deep_narrow_mlp();
  std::int64_t n = 0, owned = 0;
  for (const auto& p : net->parameters()) {
    n += p.numel();
    owned += accel::detail::shard_span_of(p.numel(), r, P).length;
  }
  // Between steps, zero2 holds the full parameters (4 n) where fully_sharded holds its slices (4 x owned). At the
  // peak (backward), both hold the full parameters, and fully_sharded its slices besides: it saves what zero2 saves
  // less 4 x owned.
  const auto predicted = zero2_saving - 4 * owned;
  INFO("process " << r << " of " << P << ": held between steps: zero2 " << zero2_held << " B, fully_sharded "
                  << zero3_held << " B, saved " << zero2_held - zero3_held << " B, predicted " << 4 * (n - owned)
                  << " B; peak of a step: data_parallel " << replicated_peak << " B, fully_sharded " << sharded_peak
                  << " B, saved " << replicated_peak - sharded_peak << " B, predicted " << predicted << " B");
  CHECK(std::abs(static_cast<double>(zero2_held - zero3_held - 4 * (n - owned))) <= 0.05 * 4.0 * (n - owned));
  CHECK(predicted > 0);
  CHECK(std::abs(static_cast<double>(replicated_peak - sharded_peak - predicted)) <=
        0.05 * static_cast<double>(predicted));
}

TEST_CASE("fully_sharded gathers before a model's forward only the parameters of that model's optimizers",
          "[sharded]") {
  const auto train_pair = []<class Policy>(std::type_identity<Policy>) {
    accel::accelerator<accel::fp32, Policy> acc;
    const int P = acc.num_processes(), r = acc.process_index();
    torch::manual_seed(5);
    uneven first_net(false), second_net(false);
    torch::optim::AdamW first_adamw(first_net->parameters(), torch::optim::AdamWOptions(1e-2));
    torch::optim::SGD second_sgd(second_net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto [first, second, first_opt, second_opt] = acc.prepare(first_net, second_net, first_adamw, second_sgd);
    torch::manual_seed(11);
    for (int step = 0; step < 4; ++step) {
      const auto x = torch::randn({4 * P, 13}), y = torch::randn({4 * P, 3});
      const auto mine = [&](const torch::Tensor& t) { return t.narrow(0, 4 * r, 4); };
      acc.backward(torch::mse_loss(first(mine(x), r), mine(y)));
      if constexpr (std::is_same_v<Policy, zero3>)  // the second model is still at rest: its slices only
        CHECK(second_net->l1->weight.dim() == 1);
      CHECK(first_net->l1->weight.dim() == 2);
      first_opt.step();
      first_opt.zero_grad();
      acc.backward(torch::mse_loss(second(mine(x), r), mine(y)));
      second_opt.step();
      second_opt.zero_grad();
    }
    auto parameters = full_parameters(acc, first);
    for (auto& p : full_parameters(acc, second)) parameters.push_back(p);
    return parameters;
  };
  const auto expected = train_pair(std::type_identity<accel::data_parallel<accel::gloo>>{});
  const auto got = train_pair(std::type_identity<zero3>{});
  accel::accelerator<accel::fp32, zero3> acc;
  check_same_parameters<zero3>(got, expected, acc.num_processes());
}

TEST_CASE(
    "fully_sharded with shard units trains as data_parallel (bit for bit at P = 2), resharding after forward or not: "
    "AdamW, Adam, SGD with Nesterov, accumulate<4> (also reduce-scattering each batch), bf16, a parameter unused on "
    "process 1",
    "[sharded]") {
  const bool reshard = GENERATE(true, false);
  const accel::sharding_options sharding{.reshard_after_forward = reshard};
  INFO("reshard_after_forward " << reshard);
  for (const auto kind : {optimizer_kind::adamw, optimizer_kind::adam, optimizer_kind::sgd_nesterov}) {
    INFO(name_of(kind));
    check_parity<accel::fp32, accel::no_accumulation, zero3, uneven_units>(kind, false, false, sharding);
  }
  check_parity<accel::fp32, accel::accumulate<4>, zero3, uneven_units>(optimizer_kind::adamw, false, false, sharding);
  check_parity<accel::fp32, accel::accumulate<4>, zero3, uneven_units>(optimizer_kind::adamw, false, true, sharding);
  check_parity<accel::bf16, accel::no_accumulation, zero3, uneven_units>(optimizer_kind::adamw, false, false, sharding);
  check_parity<accel::fp32, accel::no_accumulation, zero3, uneven_units>(optimizer_kind::adam, true, false, sharding);
  // Units are plain modules elsewhere: data_parallel trains uneven_units as uneven, bit for bit.
  using replicated = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
  const auto plain = train<replicated, uneven>(optimizer_kind::adamw, false);
  const auto wrapped = train<replicated, uneven_units>(optimizer_kind::adamw, false);
  for (std::size_t i = 0; i < plain.parameters.size(); ++i)
    CHECK(torch::equal(wrapped.parameters[i], plain.parameters[i]));
}

namespace {

/// `units` shard units of 32 x 32 (a tanh after each), then a head outside any unit.
struct stack_impl : torch::nn::Module {
  explicit stack_impl(int units) {
    for (int i = 0; i < units; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), accel::shard_unit(torch::nn::Linear(32, 32))));
    head = register_module("head", torch::nn::Linear(32, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) {
      x = torch::tanh(block(x));
      observe(x);
    }
    return head(x);
  }
  /// Called after each unit's forward and, hooked on its output, before its backward (once the unit's own hook
  /// gathered it).
  void observe(const torch::Tensor& output) {
    if (!probe) return;
    probe();
    if (output.requires_grad()) output.register_hook([this](const torch::Tensor&) { probe(); });
  }
  std::vector<accel::shard_unit<torch::nn::Linear>> blocks;
  torch::nn::Linear head{nullptr};
  std::function<void()> probe;
};
TORCH_MODULE_IMPL(unit_stack, stack_impl);

/// Bytes of the storage the model's parameters hold (each storage once): their slices at rest, their full
/// elements when gathered, nothing when freed.
std::int64_t parameter_bytes(torch::nn::Module& net) {
  std::set<const void*> seen;
  std::int64_t bytes = 0;
  for (const auto& p : net.parameters())
    if (seen.insert(p.storage().unsafeGetStorageImpl()).second)
      bytes += static_cast<std::int64_t>(p.storage().nbytes());
  return bytes;
}

}  // namespace

TEST_CASE(
    "fully_sharded with shard units: at most two units whole at once when resharding after forward (their bytes "
    "counted), each unit's gradients in buckets of its own, two all-gathers per unit and step (one without "
    "resharding); the parameters keep their names",
    "[sharded]") {
  constexpr int units = 6;
  const bool reshard = GENERATE(true, false);
  INFO("reshard_after_forward " << reshard);
  accel::accelerator<accel::fp32, zero3> acc(accel::options{.sharding = {.reshard_after_forward = reshard}});
  const int P = acc.num_processes(), r = acc.process_index();
  torch::manual_seed(3);
  unit_stack net(units);
  std::vector<std::string> names;
  for (const auto& item : net->named_parameters()) names.push_back(item.key());
  CHECK(names.front() == "block0.weight");
  CHECK(names.back() == "head.bias");
  const std::int64_t block_bytes = 4 * (32 * 32 + 32), head_bytes = 4 * (32 + 1);
  std::int64_t shards = 0;
  for (const auto& p : net->parameters()) shards += 4 * accel::detail::shard_span_of(p.numel(), r, P).length;
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2));
  auto [model, opt] = acc.prepare(net, adamw);
  std::int64_t most = 0;
  net->probe = [&] { most = std::max(most, parameter_bytes(*net)); };
  torch::manual_seed(11 + r);
  constexpr int steps = 3;
  for (int step = 0; step < steps; ++step) {
    acc.backward(model(torch::randn({4, 32})).pow(2).mean());
    opt.step();
    opt.zero_grad();
    CHECK(parameter_bytes(*net) == shards);  // at rest: the slices only
  }
  const auto* schedule = acc.parallel().unit_schedule();
  REQUIRE(schedule != nullptr);
  CHECK(schedule->size() == std::size_t{units});
  INFO("most parameter bytes held " << most << ": the head " << head_bytes << ", a unit " << block_bytes
                                    << ", this process's slices " << shards);
  if (reshard) {
    CHECK(schedule->most_units_gathered() == std::size_t{2});  // this one, and the next one's gather on its way
    CHECK(most <= head_bytes + 2 * block_bytes + shards);
  } else {
    CHECK(schedule->most_units_gathered() == std::size_t{units});
    CHECK(most >= units * block_bytes + head_bytes);
  }
  // Each gradient bucket holds one unit's parameters, or the head's.
  for (const auto& bucket : acc.parallel().reducer_for(*net)->bucket_layout()) {
    const auto unit_of = [](std::size_t parameter) { return parameter / 2; };  // weight and bias of each Linear
    for (auto parameter : bucket) CHECK(unit_of(parameter) == unit_of(bucket.front()));
  }
  // One all-gather per unit for its forward, one more for its backward when resharding, one for the head.
  const auto* shards_of = acc.parallel().shards_of(adamw);
  CHECK(shards_of->all_gather_count() == static_cast<std::uint64_t>(steps * ((reshard ? 2 : 1) * units + 1)));
  // The trained parameters equal data_parallel's.
  const auto trained = full_parameters(acc, model);
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> replicated_acc;
  torch::manual_seed(3);
  unit_stack replicated_net(units);
  torch::optim::AdamW replicated_adamw(replicated_net->parameters(), torch::optim::AdamWOptions(1e-2));
  auto [replicated_model, replicated_opt] = replicated_acc.prepare(replicated_net, replicated_adamw);
  torch::manual_seed(11 + r);
  for (int step = 0; step < steps; ++step) {
    replicated_acc.backward(replicated_model(torch::randn({4, 32})).pow(2).mean());
    replicated_opt.step();
    replicated_opt.zero_grad();
  }
  check_same_parameters<zero3>(trained, replicated_net->parameters(), P);
}

TEST_CASE(
    "fully_sharded with shard units resumes bit for bit (10 steps == 5, save, load, 5 more), and its checkpoint "
    "loads into the model without units under data_parallel, and back",
    "[sharded]") {
  check_resume_across_policies<zero3, uneven_units>("accel_units_");
}

TEST_CASE(
    "fully_sharded with a shard unit per layer: the peak bytes of a step fall by at least the full parameters less "
    "two units and one unit's gather buffers",
    "[sharded]") {
  const accel::bucket_options buckets{.first_bucket_mb = 0.125, .bucket_cap_mb = 0.125};
  const auto whole_model = peak_step_bytes<accel::accelerator<accel::fp32, zero3>>(buckets);
  const auto per_unit = peak_step_bytes<accel::accelerator<accel::fp32, zero3>>(buckets, /*units=*/true);
  accel::accelerator<accel::fp32, zero3> acc;
  const int P = acc.num_processes(), r = acc.process_index();
  // The whole model holds its 4 n bytes of full parameters at its peak (backward); a unit at a time, at most two
  // units' (one computing, the next one's gather on its way) and that gather's send and receive buffers.
  const std::int64_t n = 64 * (128 * 128 + 128), unit = 128 * 128 + 128;
  const auto unit_segment = accel::detail::shard_chunk(128 * 128, P) + accel::detail::shard_chunk(128, P);
  const auto at_least = 4 * n - 2 * 4 * unit - 4 * (P + 1) * unit_segment;
  INFO("process " << r << " of " << P << ": peak of a step, the whole model gathered " << whole_model
                  << " B, a unit at a time " << per_unit << " B, saved " << whole_model - per_unit << " B, at least "
                  << at_least << " B");
  CHECK(whole_model - per_unit >= at_least);
}

TEMPLATE_TEST_CASE(
    "a parameter of 1 MiB or more whose elements split evenly is all-gathered straight into place, to the same "
    "parameters as data_parallel's",
    "[sharded]", zero1, zero2, zero3) {
  const auto train = []<class Policy>(std::type_identity<Policy>) {
    accel::accelerator<accel::fp32, Policy> acc;
    torch::manual_seed(8);
    torch::nn::Sequential net(torch::nn::Linear(512, 512), torch::nn::Tanh(), torch::nn::Linear(512, 3));
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
    auto [model, opt] = acc.prepare(net, adamw);
    torch::manual_seed(21 + acc.process_index());
    for (int step = 0; step < 3; ++step) {
      acc.backward(model(torch::randn({4, 512})).pow(2).mean());
      opt.step();
      opt.zero_grad();
    }
    std::int64_t buffer_elements = 0;
    if constexpr (!std::is_same_v<Policy, accel::data_parallel<accel::gloo>>)
      buffer_elements = acc.parallel().shards_of(adamw)->gather_buffer_elements();
    return std::pair{full_parameters(acc, model), buffer_elements};
  };
  const auto [expected, none] = train(std::type_identity<accel::data_parallel<accel::gloo>>{});
  const auto [got, buffer_elements] = train(std::type_identity<TestType>{});
  accel::accelerator<accel::fp32, TestType> acc;
  const int P = acc.num_processes();
  check_same_parameters<TestType>(got, expected, P);
  // The 512 x 512 weight (1 MiB) needs the buffers kept between steps only where it does not split evenly (P = 3).
  constexpr std::int64_t weight = 512 * 512;
  INFO("P = " << P << ": gather buffers of " << buffer_elements << " elements");
  if (weight % P == 0)
    CHECK(buffer_elements < weight / P);
  else
    CHECK(buffer_elements >= (P + 1) * (weight / P));
}

TEMPLATE_TEST_CASE(
    "prepare_model with evaluation_mode: the parallel policy leaves the model alone (no broadcast, no "
    "gradient synchronisation, no sharding); its weights are still checkpointed",
    "[sharded]", accel::data_parallel<accel::gloo>, zero2, zero3) {
  accel::accelerator<accel::fp32, TestType> acc;
  const int r = acc.process_index();
  torch::manual_seed(100 + r);  // each process its own weights
  torch::nn::Linear net(4, 3);
  const auto own_weight = net->weight.detach().clone();
  auto scorer = acc.prepare_model(net, {.evaluation_mode = true});
  CHECK(torch::equal(net->weight, own_weight));              // not process 0's
  CHECK(net->weight.sizes() == torch::IntArrayRef({3, 4}));  // whole, not sharded
  if constexpr (requires { acc.parallel().reducer_for(*net); }) CHECK(acc.parallel().reducer_for(*net) == nullptr);
  const auto x = torch::full({2, 4}, static_cast<float>(r + 1));
  scorer(x).sum().backward();  // a local gradient: nothing all-reduced
  CHECK(torch::allclose(net->weight.grad(), x.sum(0).expand({3, 4})));
  {
    torch::NoGradGuard no_grad;
    CHECK(torch::equal(scorer(x), torch::nn::functional::linear(x, own_weight, net->bias)));
  }
  // Prepared normally, the same model would take process 0's weights.
  torch::nn::Linear trained(4, 3);
  auto model = acc.prepare(trained);
  const auto dir = accel_test::job_directory("accel_evaluation_mode_");
  acc.save_state(dir / "checkpoint");
  if (acc.is_main_process()) {
    const auto saved = accel::safetensors::load(dir / "checkpoint" / "model.safetensors");
    REQUIRE(saved.size() == 2);
    CHECK(saved[0].first == "weight");
    CHECK(torch::equal(saved[0].second, own_weight));  // the main process's evaluation model, saved first
  }
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
}

namespace {

/// Three layers of uneven sizes (no split by 2, 3 or 4 is even) and a frozen bias: every case the formula has.
torch::nn::Sequential estimate_mlp() {
  torch::manual_seed(4);
  torch::nn::Sequential net(torch::nn::Linear(64, 97), torch::nn::Tanh(), torch::nn::Linear(97, 37), torch::nn::Tanh(),
                            torch::nn::Linear(37, 5));
  net[4]->as<torch::nn::Linear>()->bias.set_requires_grad(false);
  return net;
}

std::vector<accel::tensor_extent> extents_of(torch::nn::Module& net) {
  std::vector<accel::tensor_extent> extents;
  for (const auto& p : net.parameters())
    extents.push_back({.elements = p.numel(), .element_size = p.element_size(), .trainable = p.requires_grad()});
  return extents;
}

/// What one process holds training estimate_mlp with AdamW under `Policy`, counted by accel's allocator: between
/// steps (the model included), what the third step's forward and backward left allocated, the bytes of the
/// optimizer's state tensors; and what the buckets' sizes decide, not the formula, as the policy reports it: the
/// all-gather's buffers and the reducer's 0-d scale (1 / P) per gradient bucket, both kept between steps.
struct measured_training {
  std::int64_t at_rest = 0, kept_by_step = 0, optimizer_state = 0, gather_buffers = 0, bucket_scales = 0;
};

template <class Policy>
measured_training measure_training() {
  const auto x = torch::randn({8, 64});
  measured_training measured;
  const auto before = settled_cpu_bytes();
  {
    accel::accelerator<accel::fp32, Policy> acc;
    auto net = estimate_mlp();
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
    auto [model, opt] = acc.prepare(net, adamw);
    for (int step = 0; step < 3; ++step) {
      const auto before_step = settled_cpu_bytes();
      acc.backward(model(x).pow(2).mean());
      measured.kept_by_step = settled_cpu_bytes() - before_step;
      opt.step();
      opt.zero_grad();
    }
    measured.at_rest = settled_cpu_bytes() - before;
    for (const auto& [key, state] : adamw.state())
      accel::detail::visit_state(
          *state,
          [&](std::string_view, const at::Tensor& t) {
            if (t.defined()) measured.optimizer_state += static_cast<std::int64_t>(t.nbytes());
          },
          [](std::string_view, std::int64_t) {});
    measured.bucket_scales = 4 * static_cast<std::int64_t>(acc.parallel().reducer_for(*net)->bucket_layout().size());
    if constexpr (!std::is_same_v<Policy, accel::data_parallel<accel::gloo>>)
      measured.gather_buffers = acc.parallel().shards_of(adamw)->gather_buffer_elements() * 4;
  }
  return measured;
}

template <class Policy>
void check_estimate(accel::sharding_stage stage) {
  const auto measured = measure_training<Policy>();
  accel::accelerator<accel::fp32, Policy> acc;
  auto net = estimate_mlp();
  const auto extents = extents_of(*net);
  const auto estimate = accel::estimate_training_bytes(
      extents, {.stage = stage, .processes = acc.num_processes(), .process_index = acc.process_index()});
  INFO("process " << acc.process_index() << " of " << acc.num_processes() << ": measured between steps "
                  << measured.at_rest << " B (gather buffers " << measured.gather_buffers << ", bucket scales "
                  << measured.bucket_scales << "), estimated " << estimate.at_rest()
                  << " B; kept by a step's forward and backward " << measured.kept_by_step << " B, estimated "
                  << estimate.in_step() - estimate.at_rest() << " B; optimizer state " << measured.optimizer_state
                  << " B, estimated " << estimate.optimizer_state << " B");
  CHECK(measured.optimizer_state == estimate.optimizer_state);
  CHECK(measured.at_rest - measured.gather_buffers - measured.bucket_scales == estimate.at_rest());
  CHECK(measured.kept_by_step == estimate.in_step() - estimate.at_rest());
}

}  // namespace

TEST_CASE("bigmodel.estimate: the memory formula's bytes are what each policy holds, counted", "[bigmodel_estimate]") {
  SECTION("data_parallel") { check_estimate<accel::data_parallel<accel::gloo>>(accel::sharding_stage::data_parallel); }
  SECTION("zero1") { check_estimate<accel::zero1<accel::gloo>>(accel::sharding_stage::zero1); }
  SECTION("zero2") { check_estimate<zero2>(accel::sharding_stage::zero2); }
  SECTION("fully_sharded") { check_estimate<zero3>(accel::sharding_stage::fully_sharded); }
}

namespace {

/// The bytes of the file at `path`.
std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Saves a 4-layer MLP under fully_sharded with `options` (the sharded or the full format), then, on process 0,
/// merges it with the CPU bytes counted: returns the checkpoint directory (removed by the caller).
std::filesystem::path check_merge_holds_one_tensor(const accel::options& options) {
  const auto dir = accel_test::job_directory("accel_bigmodel_merge_");
  const auto merged = accel_test::job_directory("accel_bigmodel_merged_");
  accel::accelerator<accel::fp32, zero3> acc(options);
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(256, 256), torch::nn::Linear(256, 256), torch::nn::Linear(256, 192),
                            torch::nn::Linear(192, 7));
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(net, adamw);
  acc.backward(model(torch::randn({4, 256})).pow(2).mean());
  opt.step();
  opt.zero_grad();
  const auto full = acc.get_state_dict(model);
  acc.save_state(dir);
  acc.wait_for_everyone();
  if (!acc.is_main_process()) return dir;
  std::int64_t model_bytes = 0, largest = 0;
  for (const auto& [name, tensor] : full) {
    model_bytes += static_cast<std::int64_t>(tensor.nbytes());
    largest = std::max(largest, static_cast<std::int64_t>(tensor.nbytes()));
  }
  const auto before = settled_cpu_bytes();
  accel::reset_peak_memory_stats(c10::Device(c10::kCPU));
  const auto files = accel::merge_weights(dir, merged);
  const auto peak = accel::memory_stats(c10::Device(c10::kCPU)).peak_allocated - before;
  INFO("merge_weights' peak " << peak << " B above what was allocated before; the largest tensor " << largest
                              << " B, the model " << model_bytes << " B");
  CHECK(peak >= largest);              // one tensor whole: the buffer it writes from
  CHECK(peak <= largest + 16 * 1024);  // and nothing else of the model's size
  CHECK(2 * largest < model_bytes);    // (so the whole model would not fit under that bound)
  REQUIRE(files.size() == 1);
  const auto weights = accel::safetensors::load(files.front());
  REQUIRE(weights.size() == full.size());
  for (std::size_t i = 0; i < full.size(); ++i) {
    CHECK(weights[i].first == full[i].first);
    CHECK(torch::equal(weights[i].second, full[i].second));
  }
  accel::safetensors::save(merged / "expected.safetensors", full);  // the bytes save writes for the full weights
  CHECK(file_bytes(files.front()) == file_bytes(merged / "expected.safetensors"));
  accel::detail::remove_tree(merged);
  return dir;
}

}  // namespace

TEST_CASE(
    "bigmodel.merge: merge_weights streams a sharded checkpoint, and a full one, holding one tensor at a time; a "
    "damaged shard file is refused",
    "[bigmodel_merge]") {
  const auto full_dir = check_merge_holds_one_tensor({});
  const auto dir = check_merge_holds_one_tensor(sharded_files);
  accel::accelerator<accel::fp32, zero3> acc;
  if (acc.is_main_process()) {
    auto bytes = file_bytes(dir / "model_shard_1.safetensors");
    bytes.back() = static_cast<char>(bytes.back() ^ 1);
    std::ofstream(dir / "model_shard_1.safetensors", std::ios::binary) << bytes;
    const auto out = accel_test::job_directory("accel_bigmodel_damaged_");
    CHECK_THROWS_WITH(accel::merge_weights(dir, out),
                      Catch::Contains("model_shard_1.safetensors is damaged: its checksum differs"));
    CHECK_FALSE(std::filesystem::exists(out / "model.safetensors"));
    accel::detail::remove_tree(dir);
    accel::detail::remove_tree(full_dir);
    accel::detail::remove_tree(out);
  }
  acc.wait_for_everyone();
}

// Issue 34 item 2: hybrid sharding (HSDP) on the 2 x 2 mesh of 4 processes (mesh.hsdp.* in tests/CMakeLists.txt:
// accel launch --parallelism_config_dp_replicate_size 2 --parallelism_config_dp_shard_size 2).

namespace {

using hsdp = accel::hybrid_sharded<accel::gloo>;

/// This process's index in its dp_shard group, and that group's size, from the accelerator's ParallelismConfig.
std::pair<int, int> shard_position() {
  accel::accelerator<accel::fp32, hsdp> acc;
  const auto& mesh = acc.parallelism_config();
  REQUIRE(mesh.has_value());
  return {acc.data_parallel_shard_rank(), mesh->size("dp_shard")};
}

/// Every process's copy of `parameters`, compared with this one's bit for bit: the replicas must not drift apart.
template <class Accelerator>
void check_same_everywhere(Accelerator& acc, const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : parameters) flat.push_back(p.reshape({-1}));
  const auto mine = torch::cat(flat).unsqueeze(0);
  const auto all = acc.gather(mine);
  REQUIRE(all.size(0) == acc.num_processes());
  for (int r = 0; r < acc.num_processes(); ++r) {
    INFO("process " << r << " against process " << acc.process_index());
    CHECK(torch::equal(all[r], mine[0]));
  }
}

template <class Model>
void check_hsdp_parity(optimizer_kind kind) {
  using replicated = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
  using hybrid = accel::accelerator<accel::fp32, hsdp>;
  const auto expected = train<replicated, Model>(kind, true);
  const auto got = train<hybrid, Model>(kind, true);
  hybrid acc;
  REQUIRE(got.parameters.size() == expected.parameters.size());
  for (std::size_t i = 0; i < got.parameters.size(); ++i) {
    const auto difference = (got.parameters[i] - expected.parameters[i]).abs().max().template item<double>();
    INFO(name_of(kind) << ", parameter " << i << ", max difference " << difference);
    CHECK(difference <= 1e-6);
  }
  check_same_everywhere(acc, got.parameters);
  torch::manual_seed(5);
  uneven start(true);
  CHECK_FALSE(torch::equal(got.parameters[0], start->parameters()[0]));  // it trained
}

}  // namespace

TEST_CASE("hybrid_sharded refuses a mesh without dp_replicate and dp_shard, naming the sizes and the fix",
          "[hsdp][hsdp_refusals]") {
  using accel::detail::hybrid_sharding_mesh;
  using Catch::Matchers::Contains;
  // The message of the accel::mesh_error that checking `mesh` throws (none: it threw nothing).
  const auto refusal = [](const std::optional<accel::mesh_layout>& mesh) -> std::string {
    try {
      hybrid_sharding_mesh(mesh, 4);
    } catch (const accel::mesh_error& error) {
      return error.what();
    }
    return "(nothing thrown)";
  };
  CHECK_THAT(refusal(std::nullopt), Contains("no device mesh is configured for this job of 4 processes") &&
                                        Contains("--parallelism_config_dp_replicate_size R "
                                                 "--parallelism_config_dp_shard_size S"));
  CHECK_THAT(refusal(accel::mesh_layout({.dp_shard = 4}, 4)),
             Contains("the mesh dp_replicate=1, dp_shard=4, cp=1, tp=1 lacks a dimension") &&
                 Contains("with dp_replicate=1 use accel::fully_sharded"));
  CHECK_THAT(refusal(accel::mesh_layout({.dp_replicate = 4}, 4)),
             Contains("dp_replicate=4, dp_shard=1") && Contains("with dp_shard=1 accel::data_parallel"));
  CHECK_THAT(refusal(accel::mesh_layout({.dp_shard = 2, .tp = 2}, 4)),
             Contains("has tp") && Contains("hybrid_sharded_tensor_parallel"));
  const std::optional<accel::mesh_layout> two_by_two(accel::mesh_layout({.dp_replicate = 2, .dp_shard = 2}, 4));
  CHECK(&hybrid_sharding_mesh(two_by_two, 4) == &*two_by_two);
  CHECK_THROWS_WITH(hsdp(accel::options{.sharding = {.state_dict = accel::state_dict_type::sharded}}),
                    Contains("leave it at state_dict_type::full"));
  // The program's options::parallelism_config over the launcher's 2 x 2: its sizes first, the rest from the launch.
  CHECK_THROWS_WITH(hsdp(accel::options{.parallelism_config = {.dp_replicate_size = 4, .dp_shard_size = 1}}),
                    Contains("the mesh dp_replicate=4, dp_shard=1, cp=1, tp=1 lacks a dimension"));
  CHECK_THROWS_WITH(hsdp(accel::options{.parallelism_config = {.dp_shard_size = 4}}),
                    Contains("dp_replicate=2, dp_shard=4, cp=1, tp=1 spans 8 processes"));
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc(
      accel::options{.parallelism_config = {.dp_replicate_size = 1, .dp_shard_size = 4}});
  REQUIRE(acc.parallelism_config().has_value());
  CHECK(acc.parallelism_config()->sizes() == accel::mesh_sizes{1, 4, 1, 1});
  CHECK(acc.data_parallel_shard_rank() == acc.process_index());
  CHECK(acc.data_parallel_rank() == 0);
}

TEST_CASE("hybrid_sharded trains as data_parallel within 1e-6, every replica alike bit for bit",
          "[hsdp][hsdp_parity]") {
  const auto kind = GENERATE(optimizer_kind::adamw, optimizer_kind::sgd_nesterov);
  SECTION("without shard units") { check_hsdp_parity<uneven>(kind); }
  SECTION("with shard units") { check_hsdp_parity<uneven_units>(kind); }
}

TEST_CASE("hybrid_sharded holds 1/dp_shard of the state, counted, as fully_sharded on one shard group would",
          "[hsdp][hsdp_memory]") {
  const auto measured = measure_training<hsdp>();
  const auto [shard_rank, shards] = shard_position();
  auto net = estimate_mlp();
  const auto estimate = accel::estimate_training_bytes(
      extents_of(*net),
      {.stage = accel::sharding_stage::fully_sharded, .processes = shards, .process_index = shard_rank});
  std::int64_t whole_state = 0;
  for (const auto& p : net->parameters())
    if (p.requires_grad()) whole_state += 8 * p.numel();
  INFO("shard " << shard_rank << " of " << shards << ": measured between steps " << measured.at_rest
                << " B (gather buffers " << measured.gather_buffers << ", bucket scales " << measured.bucket_scales
                << "), estimated " << estimate.at_rest() << " B; optimizer state " << measured.optimizer_state
                << " B of " << whole_state << " B in all");
  CHECK(measured.optimizer_state == estimate.optimizer_state);
  CHECK(measured.at_rest - measured.gather_buffers - measured.bucket_scales == estimate.at_rest());
  CHECK(measured.kept_by_step == estimate.in_step() - estimate.at_rest());
  // The shard group's states add up to the whole model's, once.
  accel::accelerator<accel::fp32, hsdp> acc;
  auto total = torch::tensor({static_cast<double>(measured.optimizer_state)}, torch::kDouble);
  CHECK(acc.reduce(total, accel::reduction::sum).item<double>() ==
        static_cast<double>(acc.num_processes() / shards * whole_state));
}

TEST_CASE("hybrid_sharded sends each reduced segment across the replicas: 1/dp_shard of what it reduce-scatters",
          "[hsdp][hsdp_bytes]") {
  accel::accelerator<accel::fp32, hsdp> acc;
  const auto [shard_rank, shards] = shard_position();
  auto net = estimate_mlp();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(net, adamw);
  torch::manual_seed(3 + acc.process_index());
  const auto x = torch::randn({8, 64});
  for (int step = 0; step < 3; ++step) {
    acc.backward(model(x).pow(2).mean());
    opt.step();
    opt.zero_grad();
  }
  const auto* reducer = acc.parallel().reducer_for(*net);
  REQUIRE(reducer != nullptr);
  // Each bucket: its flat tensor of S segments reduce-scattered in the shard group, one segment all-reduced across
  // the replicas; every segment is the padded chunks of its members and one flag each.
  std::vector<std::int64_t> full_numel;  // of the trainable parameters, in registration order (the reducer's)
  for (const auto& p : estimate_mlp()->parameters())
    if (p.requires_grad()) full_numel.push_back(p.numel());
  std::uint64_t segments = 0;
  for (const auto& bucket : reducer->bucket_layout()) {
    for (const auto member : bucket)
      segments += static_cast<std::uint64_t>(accel::detail::shard_chunk(full_numel[member], shards));
    segments += bucket.size();
  }
  INFO("shard " << shard_rank << ": reduce-scattered " << reducer->payload_elements() << " elements, all-reduced "
                << reducer->replica_elements() << " across replicas, formula " << 3 * segments << " per replica");
  CHECK(reducer->reduce_scatter_count() == 3 * reducer->bucket_layout().size());
  CHECK(reducer->replica_elements() == 3 * segments);
  CHECK(reducer->payload_elements() == 3 * segments * static_cast<std::uint64_t>(shards));
}

namespace {
/// Where the 2 x 2 job leaves its checkpoint and the parameters it saved, for jobs on other meshes to load.
std::filesystem::path hsdp_checkpoint() { return cross_job_directory("hybrid_sharded_2x2"); }
}  // namespace

TEST_CASE("hybrid_sharded resumes bit for bit on its mesh, and saves a checkpoint for other meshes to load",
          "[hsdp][hsdp_save]") {
  using hybrid = accel::accelerator<accel::fp32, hsdp>;
  const auto dir = hsdp_checkpoint();
  const auto uninterrupted = run_steps<hybrid>(0, 10, 5);
  const auto saved = run_steps<hybrid>(0, 5, 5, {}, dir);
  const auto resumed = run_steps<hybrid>(5, 10, 99, dir);
  for (std::size_t i = 0; i < resumed.size(); ++i) CHECK(torch::equal(resumed[i], uninterrupted[i]));
  CHECK(std::filesystem::exists(dir / "optimizer.bin"));  // the whole optimizer state, as data_parallel's
  hybrid acc;
  if (acc.is_main_process()) torch::save(saved, (dir / "saved_parameters.pt").string());
  acc.wait_for_everyone();
}

TEMPLATE_TEST_CASE(
    "a checkpoint saved by hybrid_sharded on 2 x 2 loads on another mesh: the saved parameters and optimizer state, "
    "bit for bit",
    "[hsdp_load]", accel::data_parallel<accel::gloo>, zero3) {
  using loading = accel::accelerator<accel::fp32, TestType>;
  const auto dir = hsdp_checkpoint();
  std::vector<torch::Tensor> saved;
  torch::load(saved, (dir / "saved_parameters.pt").string());
  const auto again = accel_test::job_directory("accel_hsdp_saved_again_");
  const auto loaded = run_steps<loading>(5, 5, 99, dir, again);
  REQUIRE(loaded.size() == saved.size());
  for (std::size_t i = 0; i < loaded.size(); ++i) CHECK(torch::equal(loaded[i], saved[i]));
  const auto saved_state = saved_adamw_state(dir);
  CHECK_FALSE(saved_state.empty());
  CHECK(accel_test::all_equal(saved_adamw_state(again), saved_state));
  loading acc;
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(again);
}

// Issue 33 item 2: rank-local loading (detail/checkpoint/rank_local.hpp). bigmodel.read.P4 saves and loads at 4
// processes (and keeps its sharded checkpoint for bigmodel.read.P2, which loads it at 2).

namespace {
/// The bytes this process has read (`rchar` of /proc/self/io: what its read() and pread() calls returned). Gloo's
/// receipt of the all-gathers around a load adds nothing measurable (within 3 B of the loading thread's own count).
std::int64_t process_rchar() {
  const char* file = "/proc/self/io";
  std::ifstream in(file);
  std::string key;
  std::int64_t value = 0;
  while (in >> key >> value)
    if (key == "rchar:") return value;
  FAIL("no rchar in " << file);
  return 0;
}

/// What one process may read loading the checkpoint in `dir` under `processes` processes: 1.2 x the bytes of the
/// files `sliced` selects / P, plus each such file's header, plus every other file whole (the manifest, the layout,
/// accel_state.bin, the process files, optimizer.bin).
double read_allowance(const std::filesystem::path& dir, int processes, const std::function<bool(std::string)>& sliced) {
  double sliced_bytes = 0, headers = 0, others = 0;
  for (const auto& entry : accel::detail::directory_entries(dir)) {
    const auto size = static_cast<double>(std::filesystem::file_size(entry.path()));
    if (!sliced(entry.path().filename().string())) {
      others += size;
      continue;
    }
    std::ifstream in(entry.path(), std::ios::binary);
    std::uint64_t length = 0;
    in.read(reinterpret_cast<char*>(&length), sizeof length);
    sliced_bytes += size;
    headers += 8.0 + static_cast<double>(length);
  }
  return 1.2 * sliced_bytes / processes + headers + others;
}

/// bigmodel.read's model: about 2.6 MiB of float32 in four layers, the last one's bias frozen (so held whole).
torch::nn::Sequential read_model() {
  torch::manual_seed(11);
  torch::nn::Sequential net(torch::nn::Linear(256, 512), torch::nn::Tanh(), torch::nn::Linear(512, 512),
                            torch::nn::Tanh(), torch::nn::Linear(512, 512), torch::nn::Tanh(),
                            torch::nn::Linear(512, 10));
  net->named_parameters()["6.bias"].set_requires_grad(false);
  return net;
}

/// Steps [from, to) of training `model`, each process on its own batch of the step.
template <class Accelerator, class Model, class Optimizer>
void train_read_model(Accelerator& acc, Model& model, Optimizer& opt, int from, int to) {
  for (int step = from; step < to; ++step) {
    torch::manual_seed(1000 + 10 * step + acc.process_index());
    acc.backward(model(torch::randn({8, 256})).pow(2).mean());
    opt.step();
    opt.zero_grad();
  }
}

/// This process's AdamW state of each trainable parameter, by name: exp_avg, exp_avg_sq (its slice, flat, under
/// a sharded policy) and the step.
template <class Accelerator>
std::map<std::string, std::vector<torch::Tensor>> held_state(Accelerator& acc, torch::nn::Module& net,
                                                             torch::optim::Optimizer& opt) {
  std::map<std::string, std::vector<torch::Tensor>> held;
  for (const auto& item : net.named_parameters()) {
    const auto shard = acc.parallel().shard_of(item.value());
    const auto key = accel::detail::compat::optimizer_state_key(shard ? shard->slice : item.value());
    const auto found = opt.state().find(key);
    if (found == opt.state().end()) continue;
    auto& adamw = static_cast<torch::optim::AdamWParamState&>(*found->second);
    held[item.key()] = {adamw.exp_avg().clone(), adamw.exp_avg_sq().clone(),
                        torch::scalar_tensor(static_cast<std::int64_t>(adamw.step()), torch::kLong)};
  }
  return held;
}

/// A state field of a sharded checkpoint saved by `saved` processes, put together from its files by
/// safetensors::load (each file read whole): the reference the rank-local reads are checked against.
torch::Tensor saved_state_field(const std::filesystem::path& dir, int saved, const std::string& name) {
  std::vector<torch::Tensor> pieces;
  for (int r = 0; r < saved; ++r)
    for (auto& [key, tensor] :
         accel::safetensors::load(dir / ("optimizer_shard_" + std::to_string(r) + ".safetensors")))
      if (key == name) pieces.push_back(tensor.reshape({-1}));
  return torch::cat(pieces);
}

/// Loads the sharded checkpoint in `dir` (saved by `saved` processes) into a fresh fully_sharded model and AdamW,
/// checking that this process read at most its share, that the weights are the merged checkpoint's and that each
/// process's state is its slice of the saved state, bit for bit. Returns the loaded objects' accelerator's results
/// through `then`.
template <class Then>
void load_sharded_read_model(const std::filesystem::path& dir, int saved, Then&& then) {
  accel::accelerator<accel::fp32, zero3> acc(sharded_files);
  auto net = read_model();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(net, adamw);
  const int P = acc.num_processes(), r = acc.process_index();
  const auto allocated_before = settled_cpu_bytes();
  accel::reset_peak_memory_stats(c10::Device(c10::kCPU));
  const auto before = process_rchar();
  acc.load_state(dir);
  const auto read = process_rchar() - before;
  // Nothing gathered, nothing of the weights allocated (read straight into the parameters at rest): what the load
  // allocates at its peak is AdamW's two state tensors of this process's slices (2 W / P), read once and kept by the
  // optimizer, and some headers. Staging the weights would add W / P, copying the state 2 W / P, gathering W.
  const auto added = accel::memory_stats(c10::Device(c10::kCPU)).peak_allocated - allocated_before;
  std::int64_t weights = 0;
  for (const auto& p : read_model()->parameters()) weights += p.numel() * p.element_size();
  std::cout << "bigmodel.read: process " << r << " of " << P << " allocated at most " << added
            << " B while loading (whole weights " << weights << " B)" << std::endl;
  CHECK(added <= 2 * weights / P + 65536);
  const auto allowed =
      read_allowance(dir, P, [](const std::string& name) { return name.find("_shard_") != std::string::npos; });
  INFO("process " << r << " of " << P << " read " << read << " B loading a checkpoint of " << saved
                  << " processes; allowed " << allowed << " B");
  std::cout << "bigmodel.read: sharded checkpoint of " << saved << " processes loaded at " << P << ": process " << r
            << " read " << read << " B (allowed " << static_cast<std::int64_t>(allowed) << ")" << std::endl;
  CHECK(static_cast<double>(read) <= allowed);
  const auto merged = accel_test::job_directory("accel_bigmodel_read_merged_");
  if (acc.is_main_process()) accel::merge_weights(dir, merged);
  acc.wait_for_everyone();
  const auto expected = accel::safetensors::load(merged / "model.safetensors");
  const auto loaded = acc.get_state_dict(model);
  REQUIRE(loaded.size() == expected.size());
  for (std::size_t i = 0; i < loaded.size(); ++i) CHECK(torch::equal(loaded[i].second, expected[i].second));
  for (const auto& [name, fields] : held_state(acc, *net, adamw)) {
    INFO(name);
    const auto shard = acc.parallel().shard_of(net->named_parameters()[name]);  // released: its numel is not n
    REQUIRE(shard);
    const auto span = accel::detail::shard_span_of(c10::multiply_integers(shard->sizes), r, P);
    CHECK(shard->begin == span.begin);
    const auto field = [&](const std::string& kind) {
      return saved_state_field(dir, saved, "model." + name + "/" + kind).narrow(0, span.begin, span.length);
    };
    CHECK(torch::equal(fields[0], field("exp_avg")));
    CHECK(torch::equal(fields[1], field("exp_avg_sq")));
  }
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(merged);
  then(acc, model, opt, *net, adamw);
}
}  // namespace

TEST_CASE(
    "bigmodel.read: loading into fully_sharded reads only this process's slices, of a sharded and of a full "
    "checkpoint, and goes on bit for bit",
    "[bigmodel_read]") {
  const char* keep = std::getenv("ACCEL_TEST_READ_DIR");
  const auto dir = keep != nullptr ? std::filesystem::path(keep) : accel_test::job_directory("accel_bigmodel_read_");
  std::vector<torch::Tensor> continued;
  std::map<std::string, std::vector<torch::Tensor>> saved_state;
  {
    accel::accelerator<accel::fp32, zero3> acc(sharded_files);
    auto net = read_model();
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
    auto [model, opt] = acc.prepare(net, adamw);
    train_read_model(acc, model, opt, 0, 3);
    acc.save_state(dir);
    saved_state = held_state(acc, *net, adamw);
    train_read_model(acc, model, opt, 3, 5);
    continued = full_parameters(acc, model);
  }
  load_sharded_read_model(dir, 4, [&](auto& acc, auto& model, auto& opt, torch::nn::Module& net, auto& adamw) {
    for (const auto& [name, fields] : held_state(acc, net, adamw))
      for (std::size_t f = 0; f < fields.size(); ++f) CHECK(torch::equal(fields[f], saved_state.at(name)[f]));
    train_read_model(acc, model, opt, 3, 5);
    const auto resumed = full_parameters(acc, model);
    REQUIRE(resumed.size() == continued.size());
    for (std::size_t i = 0; i < resumed.size(); ++i) CHECK(torch::equal(resumed[i], continued[i]));
  });
  {  // A bit flipped in process 1's shard file, which process 1 reads whole: its checksum fails the load everywhere.
    const auto damaged = accel_test::job_directory("accel_bigmodel_read_damaged_");
    accel::accelerator<accel::fp32, zero3> acc(sharded_files);
    if (acc.is_main_process()) {
      accel_test::copy_tree(dir, damaged);
      std::fstream file(damaged / "model_shard_1.safetensors", std::ios::in | std::ios::out | std::ios::binary);
      file.seekg(-1, std::ios::end);
      const char last = static_cast<char>(file.get());
      file.seekp(-1, std::ios::end);
      file.put(static_cast<char>(last ^ 1));
    }
    acc.wait_for_everyone();
    auto net = read_model();
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
    auto [model, opt] = acc.prepare(net, adamw);
    auto untouched = acc.get_state_dict(model);
    for (auto& [name, tensor] : untouched) tensor = tensor.clone();  // not the weights themselves
    CHECK_THROWS_WITH(acc.load_state(damaged),
                      Catch::Contains("model_shard_1.safetensors is damaged: its checksum differs"));
    // Checked before any byte of it was read into the weights: every process's weights are as they were.
    const auto after = acc.get_state_dict(model);
    REQUIRE(after.size() == untouched.size());
    for (std::size_t i = 0; i < after.size(); ++i) CHECK(torch::equal(after[i].second, untouched[i].second));
    acc.wait_for_everyone();
    if (acc.is_main_process()) accel::detail::remove_tree(damaged);
  }
  // A full checkpoint (model.safetensors; plain SGD keeps no state, so optimizer.bin is small) into fully_sharded.
  const auto full_dir = accel_test::job_directory("accel_bigmodel_read_full_");
  std::vector<torch::Tensor> saved_weights;
  {
    accel::accelerator<accel::fp32, zero3> acc;
    auto net = read_model();
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(1e-2));
    auto [model, opt] = acc.prepare(net, sgd);
    train_read_model(acc, model, opt, 0, 3);
    acc.save_state(full_dir);
    saved_weights = full_parameters(acc, model);
    train_read_model(acc, model, opt, 3, 5);
    continued = full_parameters(acc, model);
  }
  accel::accelerator<accel::fp32, zero3> acc;
  auto net = read_model();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(1e-2));
  auto [model, opt] = acc.prepare(net, sgd);
  const auto before = process_rchar();
  acc.load_state(full_dir);
  const auto read = process_rchar() - before;
  const auto allowed = read_allowance(full_dir, acc.num_processes(),
                                      [](const std::string& name) { return name == "model.safetensors"; });
  std::cout << "bigmodel.read: full checkpoint loaded at " << acc.num_processes() << ": process " << acc.process_index()
            << " read " << read << " B of a model.safetensors of "
            << std::filesystem::file_size(full_dir / "model.safetensors") << " B (allowed "
            << static_cast<std::int64_t>(allowed) << ")" << std::endl;
  CHECK(static_cast<double>(read) <= allowed);
  {  // model.safetensors a byte longer than saved: read only in part, its size (not its checksum) refuses it.
    const auto longer = accel_test::job_directory("accel_bigmodel_read_longer_");
    if (acc.is_main_process()) {
      accel_test::copy_tree(full_dir, longer);
      std::ofstream(longer / "model.safetensors", std::ios::binary | std::ios::app).put('\0');
    }
    acc.wait_for_everyone();
    CHECK_THROWS_WITH(acc.load_state(longer), Catch::Contains("model.safetensors is damaged: its 2648737 bytes differ "
                                                              "from the 2648736 saved"));
    acc.wait_for_everyone();
    if (acc.is_main_process()) accel::detail::remove_tree(longer);
  }
  const auto loaded = full_parameters(acc, model);
  REQUIRE(loaded.size() == saved_weights.size());
  for (std::size_t i = 0; i < loaded.size(); ++i) CHECK(torch::equal(loaded[i], saved_weights[i]));
  train_read_model(acc, model, opt, 3, 5);
  const auto resumed = full_parameters(acc, model);
  for (std::size_t i = 0; i < resumed.size(); ++i) CHECK(torch::equal(resumed[i], continued[i]));
  // The saved weights as Hugging Face's sharded files (an index and files of at most 1 MiB), loaded into the
  // prepared model by acc.load_model: again only the ranges of this process's slices.
  const auto hf_dir = accel_test::job_directory("accel_bigmodel_read_hf_");
  if (acc.is_main_process()) {
    auto copy = read_model();
    torch::NoGradGuard no_grad;
    auto parameters = copy->parameters();
    for (std::size_t i = 0; i < parameters.size(); ++i) parameters[i].copy_(saved_weights[i]);
    accel::save_model(*copy, hf_dir, 1 << 20);
  }
  acc.wait_for_everyone();
  const auto before_hf = process_rchar();
  acc.load_model(model, hf_dir);
  const auto read_hf = process_rchar() - before_hf;
  const auto allowed_hf = read_allowance(hf_dir, acc.num_processes(),
                                         [](const std::string& name) { return name.ends_with(".safetensors"); });
  std::cout << "bigmodel.read: Hugging Face's index and files loaded at " << acc.num_processes() << ": process "
            << acc.process_index() << " read " << read_hf << " B (allowed " << static_cast<std::int64_t>(allowed_hf)
            << ")" << std::endl;
  CHECK(static_cast<double>(read_hf) <= allowed_hf);
  CHECK(std::filesystem::exists(hf_dir / "model.safetensors.index.json"));
  const auto from_hf = full_parameters(acc, model);
  REQUIRE(from_hf.size() == saved_weights.size());
  for (std::size_t i = 0; i < from_hf.size(); ++i) CHECK(torch::equal(from_hf[i], saved_weights[i]));
  acc.wait_for_everyone();
  if (acc.is_main_process()) {
    accel::detail::remove_tree(hf_dir);
    accel::detail::remove_tree(full_dir);
    if (keep == nullptr) accel::detail::remove_tree(dir);
  }
}

TEST_CASE("bigmodel.read: a sharded checkpoint of 4 processes loads at 2, each reading only the ranges of its slices",
          "[bigmodel_read_elsewhere]") {
  const char* keep = std::getenv("ACCEL_TEST_READ_DIR");
  REQUIRE(keep != nullptr);
  load_sharded_read_model(keep, 4, [](auto&...) {});
}
