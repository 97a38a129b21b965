// accelerator::prepare and the prepared adapters: model, optimizer, scheduler, range, and send_to_device.
#include <catch2/catch.hpp>

#include <array>
#include <iterator>
#include <map>
#include <ranges>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "support.hpp"

using namespace accel_test;

namespace {

/// A user batch type with its own device transfer, which counts how often accel calls it.
struct tagged_batch {
  torch::Tensor pixels;
  int id = 0;
  inline static int transfers = 0;
};

enum class split { train, test };

using tensor_loader_dataset = torch::data::datasets::TensorDataset;

}  // namespace

template <>
struct accel::batch_traits<tagged_batch> {
  static tagged_batch to_device(const tagged_batch& b, const torch::Device& device, bool non_blocking) {
    ++tagged_batch::transfers;
    return {accel::send_to_device(b.pixels, device, non_blocking), b.id};
  }
};

TEST_CASE("prepare's concepts classify its arguments", "[prepare][concepts]") {
  STATIC_REQUIRE(accel::model_like<torch::nn::Linear>);
  STATIC_REQUIRE(accel::model_like<mlp>);
  STATIC_REQUIRE(accel::model_like<std::shared_ptr<mlp_impl>>);
  STATIC_REQUIRE(accel::model_like<std::shared_ptr<torch::nn::Module>>);
  STATIC_REQUIRE_FALSE(accel::model_like<mlp_impl>);
  STATIC_REQUIRE_FALSE(accel::model_like<std::shared_ptr<int>>);
  STATIC_REQUIRE(accel::optimizer_like<torch::optim::SGD>);
  STATIC_REQUIRE(accel::optimizer_like<torch::optim::AdamW&>);
  STATIC_REQUIRE_FALSE(accel::optimizer_like<torch::nn::Linear>);
  STATIC_REQUIRE(accel::scheduler_like<torch::optim::StepLR>);
  STATIC_REQUIRE_FALSE(accel::scheduler_like<torch::optim::SGD>);
  STATIC_REQUIRE(accel::batch_range<std::vector<torch::Tensor>>);
  STATIC_REQUIRE(accel::batch_range<std::vector<batch>&>);
  STATIC_REQUIRE(accel::batch_range<std::array<torch::Tensor, 3>>);
  STATIC_REQUIRE_FALSE(accel::batch_range<int>);
  STATIC_REQUIRE_FALSE(accel::batch_range<torch::Tensor>);
}

TEST_CASE("every prepared object is recognised as prepared, so prepare() refuses it", "[prepare][concepts]") {
  accel::accelerator<> acc;
  mlp net(2, 3, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  torch::optim::StepLR scheduler(optimizer, 1);
  std::vector<torch::Tensor> data{torch::ones(1)};
  auto [model, opt, sched, batches] = acc.prepare(net, optimizer, scheduler, data);
  STATIC_REQUIRE(accel::detail::is_prepared<decltype(model)>);
  STATIC_REQUIRE(accel::detail::is_prepared<decltype(opt)>);
  STATIC_REQUIRE(accel::detail::is_prepared<decltype(sched)>);
  STATIC_REQUIRE(accel::detail::is_prepared<decltype(batches)>);
  STATIC_REQUIRE_FALSE(accel::detail::is_prepared<mlp>);
  STATIC_REQUIRE_FALSE(accel::detail::is_prepared<std::vector<torch::Tensor>>);
}

TEST_CASE("prepare with one argument returns the prepared object itself", "[prepare]") {
  accel::accelerator<> acc;
  torch::nn::Linear net(2, 3);
  auto model = acc.prepare(net);
  STATIC_REQUIRE(std::is_same_v<decltype(model), accel::prepared_model<torch::nn::Linear, accel::accelerator<>>>);
}

TEST_CASE("prepare returns its objects in the order given", "[prepare]") {
  accel::accelerator<> acc;
  mlp net(2, 3, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  auto data = regression_batches(2, 4, 2, 1);
  auto [model, opt, batches] = acc.prepare(net, optimizer, data);
  STATIC_REQUIRE(std::is_same_v<decltype(model)::model_type, mlp>);
  STATIC_REQUIRE(std::is_same_v<decltype(opt)::optimizer_type, torch::optim::SGD>);
  STATIC_REQUIRE(std::is_same_v<decltype(batches)::batch_type, batch>);

  auto [batches2, opt2, model2] = acc.prepare(data, optimizer, net);
  CHECK(&opt2.unwrap() == &optimizer);
  CHECK(model2->fc1.get() == net->fc1.get());
  CHECK(&batches2.unwrap() == &data);
}

TEST_CASE("a prepared model runs the module's forward", "[prepare][model]") {
  accel::accelerator<> acc{{.cpu = true}};
  torch::manual_seed(0);
  mlp net(3, 4, 2);
  auto model = acc.prepare(net);
  const auto x = torch::randn({5, 3});
  CHECK(torch::equal(model(x), net(x)));
}

TEST_CASE("a prepared model forwards several arguments", "[prepare][model]") {
  accel::accelerator<> acc{{.cpu = true}};
  bilinear_sum net;
  auto model = acc.prepare(net);
  const auto x = torch::randn({2, 3});
  const auto y = torch::randn({2, 4});
  CHECK(torch::equal(model(x, y), net(x, y)));
}

TEST_CASE("prepare accepts a std::shared_ptr to a module", "[prepare][model]") {
  accel::accelerator<> acc{{.cpu = true}};
  auto net = std::make_shared<mlp_impl>(2, 3, 1);
  auto model = acc.prepare(net);
  const auto x = torch::randn({4, 2});
  CHECK(torch::equal(model(x), net->forward(x)));
  CHECK(model.operator->() == net.get());
}

TEST_CASE("operator-> and unwrap_model reach the user's module", "[prepare][model]") {
  accel::accelerator<> acc;
  mlp net(2, 3, 1);
  auto model = acc.prepare(net);
  CHECK(model.operator->() == net.get());
  CHECK(&*model == net.get());
  model->eval();
  CHECK_FALSE(net->is_training());
  auto unwrapped = acc.unwrap_model(model);  // a handle sharing the module
  STATIC_REQUIRE(std::is_same_v<decltype(unwrapped), mlp>);
  CHECK(unwrapped.get() == net.get());
  acc.unwrap_model(model)->train();  // mutable access, as through the user's own handle
  CHECK(net->is_training());
}

TEST_CASE("unwrap_model returns a model that was never prepared unchanged", "[prepare][model]") {
  accel::accelerator<> acc;
  mlp net(2, 3, 1);
  CHECK(acc.unwrap_model(net).get() == net.get());
  auto shared = std::make_shared<mlp_impl>(2, 3, 1);
  CHECK(acc.unwrap_model(shared) == shared);
}

TEST_CASE("prepare keeps the parameters' identity, so optimizers still point at them", "[prepare][model]") {
  accel::accelerator<> acc;
  mlp net(4, 8, 2);
  const auto before = parameter_identities(*net);
  torch::optim::Adam optimizer(net->parameters(), 1e-3);
  auto [model, opt] = acc.prepare(net, optimizer);
  CHECK(parameter_identities(*net) == before);
  for (const auto& p : net->parameters()) CHECK(p.device() == acc.device());
  for (std::size_t i = 0; i < before.size(); ++i)
    CHECK(optimizer.param_groups()[0].params()[i].unsafeGetTensorImpl() == before[i]);
}

TEST_CASE("a prepared optimizer steps the user's optimizer", "[prepare][optimizer]") {
  accel::accelerator<> acc;
  torch::manual_seed(2);
  torch::nn::Linear net(2, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.5);
  auto opt = acc.prepare(optimizer);
  const auto before = net->weight.clone();
  acc.backward(net(torch::ones({1, 2})).sum());
  opt.step();
  CHECK(torch::allclose(net->weight, before - 0.5 * torch::ones({1, 2})));
}

TEST_CASE("zero_grad sets gradients to none by default, as Accelerate does", "[prepare][optimizer]") {
  accel::accelerator<> acc;
  torch::nn::Linear net(2, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  auto opt = acc.prepare(optimizer);
  net(torch::ones({1, 2})).sum().backward();
  REQUIRE(net->weight.grad().defined());
  opt.zero_grad();
  CHECK_FALSE(net->weight.grad().defined());
  CHECK_FALSE(net->bias.grad().defined());
}

TEST_CASE("zero_grad(false) zeroes gradients in place", "[prepare][optimizer]") {
  accel::accelerator<> acc;
  torch::nn::Linear net(2, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  auto opt = acc.prepare(optimizer);
  net(torch::ones({1, 2})).sum().backward();
  const auto* grad_storage = net->weight.grad().data_ptr();
  opt.zero_grad(false);
  REQUIRE(net->weight.grad().defined());
  CHECK(net->weight.grad().data_ptr() == grad_storage);
  CHECK(net->weight.grad().abs().sum().item<float>() == 0.0f);
}

TEST_CASE("param_groups and -> reach the user's optimizer", "[prepare][optimizer]") {
  accel::accelerator<> acc;
  torch::nn::Linear net(2, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  auto opt = acc.prepare(optimizer);
  opt.param_groups()[0].options().set_lr(0.01);
  CHECK(optimizer.param_groups()[0].options().get_lr() == 0.01);
  CHECK(opt->param_groups().size() == 1);
  CHECK(&opt.unwrap() == &optimizer);
}

TEST_CASE("an optimizer passed as an rvalue is owned by the prepared optimizer", "[prepare][optimizer]") {
  accel::accelerator<> acc;
  torch::nn::Linear net(2, 1);
  auto opt = acc.prepare(torch::optim::SGD(net->parameters(), 0.5));
  STATIC_REQUIRE(std::is_same_v<decltype(opt), accel::prepared_optimizer<torch::optim::SGD, accel::accelerator<>>>);
  const auto before = net->bias.clone();
  acc.backward(net(torch::zeros({1, 2})).sum());
  opt.step();
  CHECK(torch::allclose(net->bias, before - 0.5));
}

TEST_CASE("a prepared scheduler steps once per optimizer step with one process", "[prepare][scheduler]") {
  accel::accelerator<> acc;
  torch::nn::Linear net(2, 1);
  torch::optim::SGD optimizer(net->parameters(), 1.0);
  torch::optim::StepLR scheduler(optimizer, /*step_size=*/2, /*gamma=*/0.5);
  auto [opt, sched] = acc.prepare(optimizer, scheduler);
  std::vector<double> lrs;
  for (int i = 0; i < 5; ++i) {
    acc.backward(net(torch::ones({1, 2})).sum());
    opt.step();
    sched.step();
    opt.zero_grad();
    lrs.push_back(optimizer.param_groups()[0].options().get_lr());
  }
  // LibTorch's StepLR (unlike Python's, whose constructor counts as a step) decays on its 3rd and 5th call.
  CHECK(lrs == std::vector<double>{1.0, 1.0, 0.5, 0.5, 0.25});
  CHECK(&sched.unwrap() == &scheduler);
}

TEST_CASE("a prepared range yields every batch in order", "[prepare][range]") {
  accel::accelerator<> acc;
  std::vector<torch::Tensor> data{torch::tensor({1}), torch::tensor({2}), torch::tensor({3})};
  auto batches = acc.prepare(data);
  std::vector<int> seen;
  for (const auto& b : batches) seen.push_back(b.item<int>());
  CHECK(seen == std::vector<int>{1, 2, 3});
  CHECK(batches.size() == 3);
}

TEST_CASE("a prepared range can be iterated once per epoch", "[prepare][range]") {
  accel::accelerator<> acc;
  auto batches = acc.prepare(regression_batches(4, 2, 3, 1));
  for (int epoch = 0; epoch < 3; ++epoch) CHECK(count_batches(batches) == 4);
}

TEST_CASE("a prepared range is a C++20 input range", "[prepare][range]") {
  accel::accelerator<> acc;
  std::vector<batch> data = regression_batches(3, 2, 2, 1);
  auto batches = acc.prepare(data);
  STATIC_REQUIRE(std::input_iterator<decltype(batches.begin())>);
  STATIC_REQUIRE(std::ranges::input_range<decltype(batches)>);
  auto firsts = batches | std::views::transform([](const batch& b) { return b.first.size(0); });
  CHECK(std::ranges::distance(firsts.begin(), firsts.end()) == 3);
}

TEST_CASE("batches bind to structured bindings", "[prepare][range]") {
  accel::accelerator<> acc{{.cpu = true}};
  auto data = regression_batches(2, 3, 4, 1);
  auto batches = acc.prepare(data);
  int i = 0;
  for (auto&& [x, y] : batches) {
    CHECK(torch::equal(x, data[i].first));
    CHECK(torch::equal(y, data[i].second));
    ++i;
  }
  CHECK(i == 2);
}

TEST_CASE("a prepared range refers to an lvalue range and owns an rvalue one", "[prepare][range]") {
  accel::accelerator<> acc;
  std::vector<torch::Tensor> data{torch::tensor({1})};
  auto referring = acc.prepare(data);
  data.push_back(torch::tensor({2}));  // seen: the range is referred to
  CHECK(count_batches(referring) == 2);

  auto owning = acc.prepare(std::vector<torch::Tensor>{torch::tensor({5}), torch::tensor({6})});
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(owning.unwrap())>, std::vector<torch::Tensor>>);
  CHECK(count_batches(owning) == 2);
}

TEST_CASE("a prepared range works over a LibTorch data loader", "[prepare][range][loader]") {
  accel::accelerator<> acc{{.cpu = true}};
  const auto inputs = torch::arange(20, torch::kFloat).reshape({10, 2});
  const auto targets = torch::arange(10, torch::kFloat);
  auto dataset = torch::data::datasets::TensorDataset({inputs})  // 10 samples
                     .map(torch::data::transforms::Stack<torch::data::TensorExample>());
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(dataset), torch::data::DataLoaderOptions(4));
  auto batches = acc.prepare(*loader);
  STATIC_REQUIRE(std::input_iterator<decltype(batches.begin())>);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::int64_t> sizes;
    torch::Tensor seen = torch::empty({0, 2});
    for (auto& b : batches) {
      sizes.push_back(b.data.size(0));
      seen = torch::cat({seen, b.data});
    }
    CHECK(sizes == std::vector<std::int64_t>{4, 4, 2});
    CHECK(torch::equal(seen, inputs));
  }
  (void)targets;
}

TEST_CASE("a data loader of input-target examples keeps both parts", "[prepare][range][loader]") {
  struct pairs : torch::data::datasets::Dataset<pairs> {
    torch::data::Example<> get(std::size_t i) override {
      return {torch::full({2}, static_cast<double>(i)), torch::tensor(static_cast<double>(i) * 10)};
    }
    torch::optional<std::size_t> size() const override { return 6; }
  };
  accel::accelerator<> acc;
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      pairs{}.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(3));
  auto batches = acc.prepare(*loader);
  double target_sum = 0;
  for (auto&& [x, y] : batches) {
    CHECK(x.sizes() == torch::IntArrayRef{3, 2});
    target_sum += y.sum().item<double>();
  }
  CHECK(target_sum == 150.0);
}

TEST_CASE("batches of every built-in structure keep their structure", "[prepare][range][device]") {
  accel::accelerator<> acc;
  using nested = std::tuple<std::vector<torch::Tensor>, std::pair<torch::Tensor, int>, std::array<torch::Tensor, 2>,
                            std::map<std::string, torch::Tensor>, std::string>;
  std::vector<nested> data;
  data.emplace_back(std::vector<torch::Tensor>{torch::ones(2), torch::zeros(3)}, std::pair{torch::ones(1), 7},
                    std::array<torch::Tensor, 2>{torch::ones(4), torch::ones(5)},
                    std::map<std::string, torch::Tensor>{{"mask", torch::ones(6)}}, "caption");
  auto batches = acc.prepare(data);
  int seen = 0;
  for (const auto& [vec, pair, arr, map, text] : batches) {
    ++seen;
    CHECK(vec.size() == 2);
    CHECK(vec[1].numel() == 3);
    CHECK(pair.second == 7);
    CHECK(arr[1].numel() == 5);
    CHECK(map.at("mask").numel() == 6);
    CHECK(text == "caption");
  }
  CHECK(seen == 1);
}

namespace {
/// Iterates two tagged batches through `acc` and returns how many device transfers that took.
template <class Accelerator>
int transfers_while_iterating(Accelerator& acc) {
  std::vector<tagged_batch> data{{torch::ones(3), 1}, {torch::ones(3), 2}};
  auto batches = acc.prepare(data);
  tagged_batch::transfers = 0;
  int id_sum = 0;
  for (const auto& b : batches) id_sum += b.id;
  CHECK(id_sum == 3);
  return tagged_batch::transfers;
}
}  // namespace

TEST_CASE("a user batch type moves through its batch_traits", "[prepare][range][device]") {
  accel::accelerator<> acc;
  CHECK(transfers_while_iterating(acc) == 2);
}

TEST_CASE("options::device_placement = false leaves batches untouched", "[prepare][range][options]") {
  accel::accelerator<> acc{{.device_placement = false}};
  CHECK_FALSE(acc.device_placement());
  CHECK(transfers_while_iterating(acc) == 0);
}

TEST_CASE("send_to_device moves every tensor of a nested batch and keeps the rest", "[device]") {
  // The meta device stands in for an accelerator: a real transfer, on any machine.
  const c10::Device meta(c10::kMeta);
  using nested = std::tuple<std::vector<torch::Tensor>, std::pair<torch::Tensor, int>, std::array<torch::Tensor, 2>,
                            std::map<std::string, torch::Tensor>, std::string>;
  const nested batch{{torch::ones(2), torch::zeros(3)},
                     {torch::ones(1), 7},
                     {torch::ones(4), torch::ones(5)},
                     {{"mask", torch::ones(6)}},
                     "caption"};
  const auto [vec, pair, arr, map, text] = accel::send_to_device(batch, meta);
  CHECK(vec.at(0).device() == meta);
  CHECK(vec.at(1).sizes() == torch::IntArrayRef{3});
  CHECK(pair.first.device() == meta);
  CHECK(pair.second == 7);
  CHECK(arr[0].device() == meta);
  CHECK(arr[1].device() == meta);
  CHECK(map.at("mask").device() == meta);
  CHECK(text == "caption");
  CHECK(std::get<0>(batch).at(0).device() == c10::Device(c10::kCPU));  // the source is untouched
}

TEST_CASE("send_to_device moves a torch::data::Example's data and target", "[device]") {
  const c10::Device meta(c10::kMeta);
  const auto moved = accel::send_to_device(torch::data::Example<>{torch::ones(2), torch::zeros(1)}, meta);
  CHECK(moved.data.device() == meta);
  CHECK(moved.target.device() == meta);
}

TEST_CASE("a batch of references becomes a tuple of values", "[device][range]") {
  const c10::Device meta(c10::kMeta);
  const torch::Tensor x = torch::ones(2), y = torch::zeros(2);
  const auto refs = std::tie(x, y);
  STATIC_REQUIRE(std::is_same_v<accel::placed_t<decltype(refs)>, std::tuple<torch::Tensor, torch::Tensor>>);
  const auto [mx, my] = accel::send_to_device(refs, meta);
  CHECK(mx.device() == meta);
  CHECK(my.device() == meta);

  accel::accelerator<> acc;
  std::vector<torch::Tensor> xs{torch::ones(1), torch::ones(1)}, ys{torch::zeros(1), torch::zeros(1)};
  auto pairs = std::views::iota(std::size_t{0}, xs.size()) |
               std::views::transform([&](std::size_t i) { return std::tie(xs[i], ys[i]); });
  auto batches = acc.prepare(pairs);
  STATIC_REQUIRE(std::is_same_v<decltype(batches)::batch_type, std::tuple<torch::Tensor, torch::Tensor>>);
  float total = 0;
  for (auto&& [bx, by] : batches) total += bx.item<float>() + by.item<float>();
  CHECK(total == 2.0f);
}

TEST_CASE("const ranges are prepared, const optimizers are refused", "[prepare][concepts]") {
  STATIC_REQUIRE(accel::batch_range<const std::vector<torch::Tensor>&>);
  STATIC_REQUIRE_FALSE(accel::optimizer_like<const torch::optim::SGD&>);
  accel::accelerator<> acc;
  const std::vector<torch::Tensor> data{torch::ones(1), torch::ones(1)};
  CHECK(count_batches(acc.prepare(data)) == 2);
}

TEST_CASE("send_to_device returns a tensor already on the device as the same tensor", "[device][zero-cost]") {
  const auto t = torch::randn({3, 3});
  const auto moved = accel::send_to_device(t, c10::Device(c10::kCPU));
  CHECK(moved.unsafeGetTensorImpl() == t.unsafeGetTensorImpl());
}

TEST_CASE("send_to_device passes values without tensors through", "[device]") {
  const c10::Device cpu(c10::kCPU);
  CHECK(accel::send_to_device(42, cpu) == 42);
  CHECK(accel::send_to_device(2.5, cpu) == 2.5);
  CHECK(accel::send_to_device(std::string("text"), cpu) == "text");
  CHECK(accel::send_to_device(split::test, cpu) == split::test);
  CHECK_FALSE(accel::send_to_device(torch::Tensor(), cpu).defined());
}

TEST_CASE("send_to_device keeps a torch::data::Example without a target", "[device]") {
  const torch::data::Example<torch::Tensor, torch::data::example::NoTarget> example{torch::ones(2)};
  const auto moved = accel::send_to_device(example, c10::Device(c10::kCPU));
  CHECK(torch::equal(moved.data, example.data));
}

TEST_CASE("get_state_dict: parameters then buffers by name, each a CPU copy of its own", "[prepare][model]") {
  accel::accelerator<> acc{{.cpu = true}};
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  auto model = acc.prepare(net);
  model(torch::randn({5, 3}));  // the running statistics move away from their initial values
  const auto state = acc.get_state_dict(model);
  std::vector<std::string> names;
  for (const auto& [name, tensor] : state) names.push_back(name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                                          "1.num_batches_tracked"});
  std::map<std::string, torch::Tensor> live;
  for (const auto& item : net->named_parameters()) live[item.key()] = item.value();
  for (const auto& item : net->named_buffers()) live[item.key()] = item.value();
  for (const auto& [name, tensor] : state) {
    INFO(name);
    CHECK(tensor.device().is_cpu());
    CHECK_FALSE(tensor.requires_grad());
    CHECK(torch::equal(tensor, live[name]));
    CHECK(tensor.data_ptr() != live[name].data_ptr());  // a copy: changing it changes nothing in the model
  }
  CHECK(torch::equal(acc.get_state_dict(net)[4].second, net[1]->named_buffers()["running_mean"]));  // unprepared too
}
