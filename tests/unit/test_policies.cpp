// Policies, their concepts, and the accelerator's per-configuration behaviour.
#include <catch2/catch.hpp>

#include <sstream>
#include <type_traits>

#include "support.hpp"

using namespace accel_test;

namespace {

/// A user-defined precision policy: plain fp32 arithmetic that counts every hook call, to show that the
/// accelerator drives its policies through the documented hooks and nothing else.
struct counting_precision : accel::precision_defaults {
  using policy_category = accel::precision_tag;
  struct scope {
    int* live;
    explicit scope(int* l) : live(l) { ++*live; }
    scope(const scope&) = delete;
    ~scope() { --*live; }
  };
  counting_precision(const accel::options&, const c10::Device&) {}
  scope forward_scope(const c10::Device&) const {
    ++forwards;
    return scope(&live_scopes);
  }
  template <class Output>
  Output forward_output(Output&& output) const {
    return std::forward<Output>(output);
  }
  void backward(const at::Tensor& loss) {
    ++backwards;
    loss.backward();
  }
  template <class Parallel>
  void step(torch::optim::Optimizer& optimizer, Parallel& parallel) {
    ++steps;
    parallel.step_optimizer(optimizer);
  }
  mutable int forwards = 0;
  mutable int live_scopes = 0;
  int backwards = 0;
  int steps = 0;
};

/// Opts into the precision family but has none of the hooks.
struct tag_only_precision {
  using policy_category = accel::precision_tag;
};

enum class colour { red };

}  // namespace

TEST_CASE("built-in policies satisfy their family's concept", "[policies]") {
  STATIC_REQUIRE(accel::precision_policy<accel::fp32>);
  STATIC_REQUIRE(accel::precision_policy<accel::bf16>);
  STATIC_REQUIRE(accel::precision_policy<accel::fp16>);
  STATIC_REQUIRE(accel::parallel_policy<accel::single_process>);
  STATIC_REQUIRE(accel::parallel_policy<accel::data_parallel<accel::gloo>>);
  STATIC_REQUIRE(accel::parallel_policy<accel::data_parallel<accel::nccl>>);
  STATIC_REQUIRE(accel::accumulation_policy<accel::no_accumulation>);
  STATIC_REQUIRE(accel::accumulation_policy<accel::accumulate<4>>);
  STATIC_REQUIRE(accel::accumulation_policy<accel::accumulate_dynamic>);
}

TEST_CASE("a policy of one family is rejected in the other slots", "[policies]") {
  STATIC_REQUIRE_FALSE(accel::precision_policy<accel::single_process>);
  STATIC_REQUIRE_FALSE(accel::precision_policy<accel::accumulate<2>>);
  STATIC_REQUIRE_FALSE(accel::parallel_policy<accel::fp32>);
  STATIC_REQUIRE_FALSE(accel::parallel_policy<accel::no_accumulation>);
  STATIC_REQUIRE_FALSE(accel::accumulation_policy<accel::bf16>);
  STATIC_REQUIRE_FALSE(accel::accumulation_policy<accel::single_process>);
}

TEST_CASE("types that are not policies satisfy no policy concept", "[policies]") {
  STATIC_REQUIRE_FALSE(accel::precision_policy<int>);
  STATIC_REQUIRE_FALSE(accel::parallel_policy<torch::Tensor>);
  STATIC_REQUIRE_FALSE(accel::accumulation_policy<void*>);
  STATIC_REQUIRE_FALSE(accel::precision_policy<accel::gloo>);
}

TEST_CASE("a policy with the tag but without the hooks is rejected", "[policies]") {
  STATIC_REQUIRE_FALSE(accel::precision_policy<tag_only_precision>);
}

TEST_CASE("data_parallel takes gloo or nccl as its backend", "[policies]") {
  STATIC_REQUIRE(accel::communication_backend<accel::gloo>);
  STATIC_REQUIRE(accel::communication_backend<accel::nccl>);
  STATIC_REQUIRE_FALSE(accel::communication_backend<accel::fp32>);
  STATIC_REQUIRE_FALSE(accel::communication_backend<int>);
  STATIC_REQUIRE(std::is_same_v<accel::data_parallel<accel::gloo>::backend_type, accel::gloo>);
}

TEST_CASE("no_accumulation is accumulate<1>", "[policies]") {
  STATIC_REQUIRE(std::is_same_v<accel::no_accumulation, accel::accumulate<1>>);
  STATIC_REQUIRE(accel::no_accumulation::steps() == 1);
}

TEST_CASE("accelerator<> is fp32, single_process, no_accumulation", "[accelerator]") {
  using default_accelerator = accel::accelerator<>;
  STATIC_REQUIRE(std::is_same_v<default_accelerator::precision_type, accel::fp32>);
  STATIC_REQUIRE(std::is_same_v<default_accelerator::parallel_type, accel::single_process>);
  STATIC_REQUIRE(std::is_same_v<default_accelerator::accumulation_type, accel::no_accumulation>);
  STATIC_REQUIRE(std::is_default_constructible_v<default_accelerator>);
  STATIC_REQUIRE(std::is_constructible_v<default_accelerator, const accel::options&>);
}

TEST_CASE("an accelerator is neither copied nor moved, since prepared objects refer to it", "[accelerator]") {
  STATIC_REQUIRE_FALSE(std::is_copy_constructible_v<accel::accelerator<>>);
  STATIC_REQUIRE_FALSE(std::is_move_constructible_v<accel::accelerator<>>);
  STATIC_REQUIRE_FALSE(std::is_copy_assignable_v<accel::accelerator<>>);
}

TEST_CASE("fp32 and no_accumulation take no storage in the accelerator", "[accelerator][zero-cost]") {
  STATIC_REQUIRE(std::is_empty_v<accel::fp32>);
  STATIC_REQUIRE(std::is_empty_v<accel::no_accumulation>);
  STATIC_REQUIRE(std::is_empty_v<accel::bf16>);
  // The accelerator's own members besides the policies, laid out alike: the empty policies add nothing to them.
  struct same_members_without_empty_policies {
    accel::single_process parallel;
    accel::options options;
    std::optional<accel::mesh_layout> parallelism;
    accel::gradient_state gradient_state;
    accel::detail::checkpoint_schedule schedule;
    std::optional<std::filesystem::path> resumed_from;
    bool trigger;
    accel::detail::prepared_registry registry;
    accel::detail::training_state<accel::single_process, accel::fp32, accel::no_accumulation, accel::single_process,
                                  accel::detail::checkpoint_schedule>
        state;
    std::shared_ptr<accel::detail::tracker_set> trackers;
    void (*finish_trackers)(accel::detail::tracker_set&);
    void (*log_verdict)(accel::detail::tracker_set&, const accel::detail::straggler_verdict&, std::int64_t);
    accel::detail::straggler_report stragglers;
  };
  STATIC_REQUIRE(sizeof(accel::accelerator<>) == sizeof(same_members_without_empty_policies));
}

TEST_CASE("fp32's forward scope is an empty object", "[precision][zero-cost]") {
  accel::accelerator<> acc;
  STATIC_REQUIRE(std::is_empty_v<decltype(acc.autocast())>);
}

TEST_CASE("fp32 backward is loss.backward() and its step is optimizer.step()", "[precision]") {
  torch::manual_seed(1);
  mlp a(3, 5, 1);
  torch::manual_seed(1);
  mlp b(3, 5, 1);
  const auto x = torch::randn({8, 3});
  accel::fp32 precision;
  precision.backward(a(x).pow(2).mean());
  b(x).pow(2).mean().backward();
  for (std::size_t i = 0; i < a->parameters().size(); ++i)
    CHECK(torch::equal(a->parameters()[i].grad(), b->parameters()[i].grad()));

  torch::optim::SGD opt_a(a->parameters(), 0.5);
  torch::optim::SGD opt_b(b->parameters(), 0.5);
  accel::single_process parallel{accel::options{}};
  precision.step(opt_a, parallel);
  opt_b.step();
  CHECK(bitwise_equal(*a, *b));
  CHECK_FALSE(precision.step_was_skipped());
}

TEST_CASE("no_accumulation always syncs and passes the loss through untouched", "[accumulation][zero-cost]") {
  accel::no_accumulation policy{accel::options{}};
  STATIC_REQUIRE(policy.sync_gradients());
  const auto loss = torch::tensor(2.5);
  CHECK(&policy.scale_loss(loss) == &loss);  // the same object: no division, no copy
}

TEST_CASE("a single process is process 0 of 1, main, local main and last", "[parallel]") {
  accel::accelerator<> acc;
  CHECK(acc.process_index() == 0);
  CHECK(acc.local_process_index() == 0);
  CHECK(acc.num_processes() == 1);
  CHECK(acc.is_main_process());
  CHECK(acc.is_local_main_process());
  CHECK(acc.is_last_process());
}

TEST_CASE("single_process uses CUDA device 0 when there is one, else the CPU", "[parallel]") {
  accel::accelerator<> acc;
  if (torch::cuda::is_available())
    CHECK(acc.device() == c10::Device(c10::kCUDA, 0));
  else
    CHECK(acc.device() == c10::Device(c10::kCPU));
}

TEST_CASE("options::cpu forces the CPU", "[parallel][options]") {
  accel::accelerator<> acc{{.cpu = true}};
  CHECK(acc.device() == c10::Device(c10::kCPU));
  CHECK(acc.device_placement());
}

TEST_CASE("sync_gradients is true and no step is reported skipped under fp32", "[accelerator]") {
  accel::accelerator<> acc;
  CHECK(acc.sync_gradients());
  CHECK_FALSE(acc.optimizer_step_was_skipped());
}

TEST_CASE("wait_for_everyone returns at once with one process", "[parallel]") {
  accel::accelerator<> acc;
  acc.wait_for_everyone();
  SUCCEED();
}

namespace {
/// Captures what is written to std::cout while alive.
struct capture_cout {
  std::ostringstream text;
  std::streambuf* previous = std::cout.rdbuf(text.rdbuf());
  ~capture_cout() { std::cout.rdbuf(previous); }
};
}  // namespace

TEST_CASE("print separates its arguments by spaces and ends the line", "[accelerator][print]") {
  accel::accelerator<> acc;
  capture_cout out;
  acc.print("epoch", 3, "loss", 0.25);
  acc.print();
  acc.print("done");
  CHECK(out.text.str() == "epoch 3 loss 0.25\n\ndone\n");
}

TEST_CASE("print formats tensors and devices as operator<< does", "[accelerator][print]") {
  accel::accelerator<> acc;
  const auto t = torch::tensor({1, 2});
  std::ostringstream expected;
  expected << "t: " << t << ' ' << acc.device() << '\n';
  capture_cout out;
  acc.print("t:", t, acc.device());
  CHECK(out.text.str() == expected.str());
}

TEST_CASE("a user-defined precision policy is driven through its hooks", "[policies][custom]") {
  STATIC_REQUIRE(accel::precision_policy<counting_precision>);
  accel::accelerator<counting_precision> acc{{.cpu = true}};
  torch::manual_seed(3);
  mlp net(2, 4, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, optimizer);
  const counting_precision& policy = acc.precision();

  // A module that records whether the policy's scope is alive while its forward runs.
  struct probe_impl : torch::nn::Module {
    const counting_precision* policy = nullptr;
    int live_during_forward = -1;
    torch::Tensor forward(const torch::Tensor& x) {
      live_during_forward = policy->live_scopes;
      return x * 2;
    }
  };
  auto probe = std::make_shared<probe_impl>();
  probe->policy = &policy;
  auto probe_model = acc.prepare(probe);
  probe_model(torch::ones(1));
  CHECK(probe->live_during_forward == 1);
  probe->forward(torch::ones(1));  // the module itself, without the prepared wrapper: no scope
  CHECK(probe->live_during_forward == 0);
  probe_model.forward(torch::ones(1));
  CHECK(probe->live_during_forward == 1);

  for (int i = 0; i < 3; ++i) {
    auto out = model(torch::randn({5, 2}));
    CHECK(policy.live_scopes == 0);  // the forward scope ended with the forward
    acc.backward(out.pow(2).mean());
    opt.step();
    opt.zero_grad();
  }
  CHECK(policy.forwards == 5);  // 2 probe calls + 3 training steps
  CHECK(policy.backwards == 3);
  CHECK(policy.steps == 3);
  {
    auto scope = acc.autocast();
    CHECK(policy.live_scopes == 1);
  }
  CHECK(policy.live_scopes == 0);
}

// Issue 16: zero1 and zero2 under a world of one (no launcher) are data parallelism over one process; what they
// cannot shard is refused at prepare with the reason. (Their multi-process behaviour:
// tests/distributed/test_sharded.cpp.)
TEST_CASE(
    "zero1, zero2 and fully_sharded on one process train as data_parallel, a stepped optimizer or an unprepared model "
    "is refused",
    "[policies]") {
  using Catch::Contains;
  STATIC_REQUIRE(accel::parallel_policy<accel::zero1<accel::gloo>>);
  STATIC_REQUIRE(accel::parallel_policy<accel::zero2<accel::gloo>>);
  STATIC_REQUIRE(accel::parallel_policy<accel::fully_sharded<accel::gloo>>);
  CHECK(accel::zero2<accel::gloo>::name() == "zero2<gloo>");
  CHECK(accel::fully_sharded<accel::gloo>::name() == "fully_sharded<gloo>");
  using sharded = accel::accelerator<accel::fp32, accel::zero1<accel::gloo>>;
  using sharded_gradients = accel::accelerator<accel::fp32, accel::zero2<accel::gloo>>;
  using fully_sharded = accel::accelerator<accel::fp32, accel::fully_sharded<accel::gloo>>;
  using replicated = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
  const auto train = []<class Accelerator>(std::type_identity<Accelerator>) {
    Accelerator acc;
    torch::manual_seed(2);
    auto net = torch::nn::Linear(3, 2);
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.1).weight_decay(0.01));
    auto [model, opt] = acc.prepare(net, adam);
    for (int step = 0; step < 5; ++step) {
      acc.backward(model(torch::ones({4, 3}) * step).pow(2).sum());
      opt.step();
      opt.zero_grad();
    }
    // fully_sharded: between steps the weight holds its one shard, flat
    CHECK(net->weight.dim() == (std::is_same_v<Accelerator, fully_sharded> ? 1 : 2));
    return acc.get_state_dict(model)[0].second;
  };
  CHECK(torch::equal(train(std::type_identity<sharded>{}), train(std::type_identity<replicated>{})));
  CHECK(torch::equal(train(std::type_identity<sharded_gradients>{}), train(std::type_identity<replicated>{})));
  CHECK(torch::equal(train(std::type_identity<fully_sharded>{}), train(std::type_identity<replicated>{})));

  sharded_gradients acc;
  auto net = torch::nn::Linear(3, 2);
  torch::optim::SGD stepped(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  net(torch::ones({1, 3})).sum().backward();
  stepped.step();
  CHECK_THROWS_WITH(acc.prepare(net, stepped), Contains("has stepped already") && Contains("before its first step"));
  auto other = torch::nn::Linear(3, 2);
  torch::optim::SGD fresh(other->parameters(), torch::optim::SGDOptions(0.1));
  CHECK_THROWS_WITH(acc.prepare(fresh), Contains("belongs to no prepared model") && Contains("the model first"));
}

namespace {
/// A projection whose weight is another module's (a tied embedding): registered here too, under its own name.
struct tied_projectionImpl : torch::nn::Module {
  explicit tied_projectionImpl(const torch::Tensor& shared) : weight(register_parameter("weight", shared)) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(tied_projection);
/// An embedding and its tied projection in one module.
struct tied_pairImpl : torch::nn::Module {
  explicit tied_pairImpl(torch::nn::Linear shared)
      : embed(register_module("embed", shared)), head(register_module("head", tied_projection(shared->weight))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(embed(x)); }
  torch::nn::Linear embed;
  tied_projection head;
};
TORCH_MODULE(tied_pair);
}  // namespace

TEST_CASE("redteam 7: a weight tied across two shard units is refused at prepare, naming it and both units",
          "[policies]") {
  torch::nn::Linear embed(6, 6);
  const auto tied = [&embed](bool embed_in_unit) {
    torch::nn::Sequential net;
    if (embed_in_unit)
      net->push_back("embed", accel::shard_unit(embed));
    else
      net->push_back("embed", embed);
    net->push_back("head", accel::shard_unit(tied_projection(embed->weight)));
    return net;
  };
  for (const bool embed_in_unit : {true, false}) {
    accel::accelerator<accel::fp32, accel::fully_sharded<accel::gloo>> acc;
    auto net = tied(embed_in_unit);
    CHECK_THROWS_WITH(acc.prepare(net),
                      Catch::Contains("the parameter embed.weight is also head.weight (a tied weight)") &&
                          Catch::Contains(embed_in_unit ? "in the shard units 'embed' and 'head'"
                                                        : "in the shard units (no unit) and 'head'") &&
                          Catch::Contains("wrap the modules that share it in one shard unit"));
  }
  // Both uses in one unit: gathered and freed together, so it trains.
  accel::accelerator<accel::fp32, accel::fully_sharded<accel::gloo>> acc;
  auto unit = accel::shard_unit(tied_pair(embed));
  torch::optim::SGD sgd(unit->parameters(), 0.1);
  auto [model, opt] = acc.prepare(unit, sgd);
  acc.backward(model(torch::ones({2, 6})).sum());
  opt.step();
  CHECK(model(torch::ones({2, 6})).sum().item<float>() != 0);  // gathered again for the next forward, whole
  CHECK(unit->module()->head->weight.is_same(embed->weight));
}

// Issue 16: accel::shard_unit is a plain module under every policy but fully_sharded, which gathers and frees its
// parameters around it (on several processes: tests/distributed/test_sharded.cpp).
TEST_CASE(
    "shard_unit keeps the wrapped module's names, forward and training mode, fits in a Sequential, and trains under "
    "fully_sharded on one process as data_parallel",
    "[policies]") {
  torch::manual_seed(3);
  torch::nn::Sequential plain(torch::nn::Linear(4, 6), torch::nn::Dropout(0.5), torch::nn::Linear(6, 2));
  torch::manual_seed(3);
  torch::nn::Sequential units(accel::shard_unit(torch::nn::Linear(4, 6)), accel::shard_unit(torch::nn::Dropout(0.5)),
                              accel::shard_unit(torch::nn::Linear(6, 2)));
  std::vector<std::string> plain_names, unit_names;
  for (const auto& item : plain->named_parameters()) plain_names.push_back(item.key());
  for (const auto& item : units->named_parameters()) unit_names.push_back(item.key());
  CHECK(unit_names == plain_names);                                 // "0.weight", not "0.module.weight"
  CHECK(units->parameters().size() == plain->parameters().size());  // each parameter once
  const auto x = torch::randn({3, 4});
  plain->eval();
  units->eval();  // reaches the wrapped Dropout
  CHECK(torch::equal(units->forward(x), plain->forward(x)));
  units->train();
  torch::manual_seed(8);
  const auto dropped = units->forward(x);
  plain->train();
  torch::manual_seed(8);
  CHECK(torch::equal(dropped, plain->forward(x)));
  std::ostringstream printed;
  printed << *units;
  CHECK_THAT(printed.str(), Catch::Contains("accel::shard_unit(torch::nn::Linear(in_features=4"));

  const auto train = []<class Policy>(std::type_identity<Policy>) {
    accel::accelerator<accel::fp32, Policy> acc;
    torch::manual_seed(2);
    torch::nn::Sequential net(accel::shard_unit(torch::nn::Linear(3, 5)), torch::nn::Tanh(),
                              accel::shard_unit(torch::nn::Linear(5, 2)));
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.1));
    auto [model, opt] = acc.prepare(net, adam);
    for (int step = 0; step < 5; ++step) {
      acc.backward(model(torch::ones({4, 3}) * step).pow(2).sum());
      opt.step();
      opt.zero_grad();
    }
    std::vector<torch::Tensor> weights;
    for (auto& [name, tensor] : acc.get_state_dict(model)) weights.push_back(tensor);
    return weights;
  };
  const auto sharded = train(std::type_identity<accel::fully_sharded<accel::gloo>>{});
  const auto replicated = train(std::type_identity<accel::data_parallel<accel::gloo>>{});
  REQUIRE(sharded.size() == replicated.size());
  for (std::size_t i = 0; i < sharded.size(); ++i) CHECK(torch::equal(sharded[i], replicated[i]));
}

namespace {
/// A block whose forward is overloaded: no single signature, as for a template forward.
struct two_forwards_impl : torch::nn::Module {
  two_forwards_impl() : linear(register_module("linear", torch::nn::Linear(3, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return linear(x); }
  torch::Tensor forward(const torch::Tensor& x, double scale) { return linear(x) * scale; }
  torch::nn::Linear linear;
};
TORCH_MODULE_IMPL(two_forwards, two_forwards_impl);

/// `block`'s parameters after 4 Adam steps on `loss(model(x))` under `Policy`, with `block(x)` as the model's call.
template <class Policy, class Block>
std::vector<torch::Tensor> trained_block(Block block) {
  accel::accelerator<accel::fp32, Policy> acc;
  torch::optim::Adam adam(block->parameters(), torch::optim::AdamOptions(0.1));
  auto [model, opt] = acc.prepare(block, adam);
  for (int step = 0; step < 4; ++step) {
    acc.backward(model(torch::ones({4, 3}) * step).pow(2).sum());
    opt.step();
    opt.zero_grad();
  }
  std::vector<torch::Tensor> weights;
  for (auto& [name, tensor] : acc.get_state_dict(model)) weights.push_back(tensor);
  return weights;
}
}  // namespace

// Issue 40, item 1: a unit around a module whose forward is a template (Sequential) or overloaded was not callable:
// its forward fell back to one taking nothing. It takes what the wrapped module's forward takes.
TEST_CASE("shard_unit around a Sequential or an overloaded forward is called as block(x), and trains as the module",
          "[policies]") {
  torch::manual_seed(5);
  torch::nn::Sequential sequential(torch::nn::Linear(3, 4), torch::nn::Tanh(), torch::nn::Linear(4, 2));
  accel::shard_unit block(sequential);
  const auto x = torch::randn({5, 3});
  CHECK(torch::equal(block(x), sequential->forward(x)));
  CHECK(torch::equal(block->forward(x), sequential->forward(x)));
  two_forwards overloaded;
  accel::shard_unit unit(overloaded);
  CHECK(torch::equal(unit(x), overloaded->forward(x)));
  CHECK(torch::equal(unit(x, 2.0), overloaded->forward(x, 2.0)));

  // fully_sharded on one process trains a Sequential unit as data_parallel trains the Sequential.
  const auto fresh = [] {
    torch::manual_seed(6);
    return torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::Tanh(), torch::nn::Linear(4, 2));
  };
  const auto sharded = trained_block<accel::fully_sharded<accel::gloo>>(accel::shard_unit(fresh()));
  const auto replicated = trained_block<accel::data_parallel<accel::gloo>>(fresh());
  REQUIRE(sharded.size() == replicated.size());
  for (std::size_t i = 0; i < sharded.size(); ++i) CHECK(torch::equal(sharded[i], replicated[i]));
}
