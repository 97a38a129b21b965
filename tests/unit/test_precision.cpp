// Mixed precision: bf16 autocast on the CPU, and fp16's dynamic loss scaling. LibTorch 1.13 has no float16
// autocast on the CPU, so the loss scaling is tested everywhere through `scaled_fp32` (support.hpp) (accel::fp16's own
// scaler, unscale and step, driven by the accelerator exactly as for fp16, with the forward left in float32), and
// with LibTorch >= 2.4 also through accel::fp16 itself under float16 autocast on the CPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "support.hpp"

namespace {

using namespace accel_test;
using accel::detail::compat::autocast_enabled;

/// Records the dtype its inner matmul produced; returns the output and a second tensor.
struct probe_impl : torch::nn::Module {
  probe_impl() : fc(register_module("fc", torch::nn::Linear(3, 2))) {}
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    auto h = fc(x);
    inner = h.scalar_type();
    autocast_inside = autocast_enabled(c10::DeviceType::CPU);
    return {h, h * 2};
  }
  torch::nn::Linear fc;
  c10::ScalarType inner = c10::ScalarType::Undefined;
  bool autocast_inside = false;
};
TORCH_MODULE_IMPL(probe, probe_impl);

/// Trains y = x A + b by SGD and returns the final float32 loss.
template <class Precision>
double regression_loss(int steps) {
  accel::accelerator<Precision> acc{{.cpu = true}};
  torch::manual_seed(4);
  auto truth = torch::randn({8, 2});
  auto net = mlp(8, 32, 2);
  torch::optim::Adam optimizer(net->parameters(), 1e-2);
  auto [model, opt] = acc.prepare(net, optimizer);
  for (int i = 0; i < steps; ++i) {
    auto x = torch::randn({64, 8});
    acc.backward(torch::mse_loss(model(x), x.mm(truth)));
    opt.step();
    opt.zero_grad();
  }
  torch::NoGradGuard no_grad;
  auto x = torch::randn({1024, 8});
  return torch::mse_loss(net->forward(x), x.mm(truth)).item<double>();
}

/// Equal dtype, shape and bits (NaN payloads included).
bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         torch::equal(a.contiguous().view(torch::kInt), b.contiguous().view(torch::kInt));
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> grads;
  for (auto& p : m.parameters()) grads.push_back(p.grad().clone());
  return grads;
}

}  // namespace

TEST_CASE("bf16: matmuls in bfloat16, outputs and master weights in float32, no autocast leak", "[precision]") {
  accel::accelerator<accel::bf16> acc{{.cpu = true}};
  auto net = probe();
  auto model = acc.prepare(net);
  REQUIRE_FALSE(autocast_enabled(c10::DeviceType::CPU));
  auto [out, twice] = model(torch::randn({4, 3}));
  CHECK(net->autocast_inside);
  CHECK(net->inner == torch::kBFloat16);
  CHECK(out.scalar_type() == torch::kFloat);  // converted back, nested outputs too
  CHECK(twice.scalar_type() == torch::kFloat);
  CHECK(net->fc->weight.scalar_type() == torch::kFloat);
  CHECK_FALSE(autocast_enabled(c10::DeviceType::CPU));
  SECTION("nesting: acc.autocast() outside, the model's scope inside") {
    {
      auto scope = acc.autocast();
      CHECK(autocast_enabled(c10::DeviceType::CPU));
      (void)model(torch::randn({1, 3}));
      CHECK(autocast_enabled(c10::DeviceType::CPU));  // the inner scope restored the outer state
      CHECK(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type() == torch::kBFloat16);
    }
    CHECK_FALSE(autocast_enabled(c10::DeviceType::CPU));
  }
  SECTION("an exception in forward leaves no autocast behind") {
    struct throwing_impl : torch::nn::Module {
      torch::Tensor forward(const torch::Tensor&) { throw std::runtime_error("forward fails"); }
    };
    auto failing = acc.prepare(std::make_shared<throwing_impl>());
    CHECK_THROWS(failing(torch::ones({1})));
    CHECK_FALSE(autocast_enabled(c10::DeviceType::CPU));
  }
}

TEST_CASE("bf16 trains a regression to within 2x of fp32's loss", "[precision]") {
  const double fp32_loss = regression_loss<accel::fp32>(300);
  const double bf16_loss = regression_loss<accel::bf16>(300);
  INFO("fp32 " << fp32_loss << ", bf16 " << bf16_loss);
  CHECK(fp32_loss < 0.05);  // it did learn
  CHECK(bf16_loss < 2 * fp32_loss);
}

#if ACCEL_TORCH_VERSION >= 204
TEST_CASE("fp16 on the CPU (LibTorch >= 2.4): float16 matmuls, float32 outputs and weights, trains like fp32",
          "[precision]") {
  {
    accel::accelerator<accel::fp16> acc{{.cpu = true}};
    auto net = probe();
    auto model = acc.prepare(net);
    auto [out, twice] = model(torch::randn({4, 3}));
    CHECK(net->inner == torch::kHalf);  // the matmul ran in float16
    CHECK(net->autocast_inside);
    CHECK(out.scalar_type() == torch::kFloat);
    CHECK(twice.scalar_type() == torch::kFloat);
    CHECK(net->fc->weight.scalar_type() == torch::kFloat);  // float32 master weights
    CHECK_FALSE(autocast_enabled(c10::DeviceType::CPU));    // nothing left behind
  }
  const double fp32_loss = regression_loss<accel::fp32>(300);
  const double fp16_loss = regression_loss<accel::fp16>(300);
  INFO("fp32 " << fp32_loss << ", fp16 " << fp16_loss);
  CHECK(fp32_loss < 0.05);
  CHECK(fp16_loss < 2 * fp32_loss);
}
#else
TEST_CASE("fp16 on the CPU needs LibTorch >= 2.4: the error names the version and suggests bf16", "[precision]") {
  CHECK_THROWS_WITH(accel::accelerator<accel::fp16>(accel::options{.cpu = true}),
                    Catch::Contains("no Half autocast on cpu") && Catch::Contains("use accel::bf16 on the CPU"));
}
#endif

TEST_CASE("unscaling: LibTorch's fused kernel and the per-gradient pass give the same bits and the same verdict",
          "[precision][scaler]") {
  using accel::detail::unscale_each;
  using accel::detail::unscale_fused;
  // The scaler takes the fused kernel on the CPU exactly where LibTorch has it (2.3 on).
  CHECK(accel::detail::compat::fused_unscale_available(c10::DeviceType::CPU) == (ACCEL_TORCH_VERSION >= 203));
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const float inverse = 1.0f / 65536;
  torch::manual_seed(5);
  for (const double poison : {0.0, inf, -inf, nan}) {
    INFO("poison " << poison);
    std::vector<torch::Tensor> original{torch::randn({7, 3}) * 1000, torch::randn({5}),
                                        torch::randn({2, 2, 2}) * 1e-30};
    if (poison != 0) original[1][2] = poison;
    std::vector<torch::Tensor> each;
    for (auto& g : original) each.push_back(g.clone());
    CHECK(unscale_each(each, inverse) == (poison != 0));
    for (std::size_t i = 0; i < original.size(); ++i) CHECK(same_bits(each[i], original[i] * inverse));
    if (ACCEL_TORCH_VERSION >= 203) {
      std::vector<torch::Tensor> fused;
      for (auto& g : original) fused.push_back(g.clone());
      CHECK(unscale_fused(fused, inverse) == (poison != 0));
      for (std::size_t i = 0; i < original.size(); ++i) CHECK(same_bits(fused[i], each[i]));
    }
  }
}

namespace {
/// PyTorch's GradScaler with init_scale 1024, growth_interval 3, written out: overflow halves the scale and resets
/// the count of clean steps; the 3rd clean step in a row doubles it. The hand-written model runs under the same
/// autocast as the prepared one, so that both see the same forward.
template <class Precision>
void check_grad_scaler_sequence() {
  accel::accelerator<Precision> acc{{.cpu = true, .grad_scaler = {.init_scale = 1024, .growth_interval = 3}}};
  torch::manual_seed(2);
  auto net = torch::nn::Linear(2, 1);
  auto by_hand = torch::nn::Linear(2, 1);
  copy_parameters(*by_hand, *net);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  lambda_lr schedule(optimizer, [](int n) { return 1.0 / (1 + n); });
  auto [model, opt, sched] = acc.prepare(net, optimizer, schedule);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> injected = {0, inf, nan, 0, 0, 0, 0};
  const std::vector<bool> expected_skipped = {false, true, true, false, false, false, false};
  const std::vector<float> expected_scale = {1024, 512, 256, 256, 256, 512, 512};
  const std::vector<int> expected_tracker = {1, 0, 0, 1, 2, 0, 1};
  for (std::size_t i = 0; i < injected.size(); ++i) {
    INFO("step " << i);
    auto x = torch::randn({4, 2});
    const float scale_before = acc.precision().scaler().state().scale;
    acc.backward(model(x).sum());
    by_hand->zero_grad();
    {
      [[maybe_unused]] auto scope = acc.autocast();
      by_hand->forward(x).to(torch::kFloat).sum().backward();
    }
    CHECK(torch::allclose(net->weight.grad(), by_hand->weight.grad() * scale_before));  // backward scaled the loss
    if (injected[i] != 0) net->weight.mutable_grad()[0][0] = injected[i];
    const double lr = optimizer.param_groups()[0].options().get_lr();
    opt.step();
    sched.step();
    opt.zero_grad();
    CHECK(acc.optimizer_step_was_skipped() == expected_skipped[i]);
    CHECK(acc.precision().scaler().state().scale == expected_scale[i]);
    CHECK(acc.precision().scaler().state().growth_tracker == expected_tracker[i]);
    if (!expected_skipped[i]) {  // the step used the unscaled gradient
      torch::NoGradGuard no_grad;
      for (auto& p : by_hand->parameters()) p.sub_(lr * p.grad());
    }
    CHECK(torch::allclose(net->weight, by_hand->weight, 1e-6, 1e-6));  // unchanged by skipped steps
    CHECK(torch::allclose(net->bias, by_hand->bias, 1e-6, 1e-6));
  }
  CHECK(schedule.steps() == 5);  // skipped steps do not advance the scheduler
}
}  // namespace

TEST_CASE("fp16 loss scaling follows PyTorch's GradScaler step by step (H4)", "[precision][scaler]") {
  check_grad_scaler_sequence<scaled_fp32>();
}

#if ACCEL_TORCH_VERSION >= 204
TEST_CASE("fp16 under float16 autocast on the CPU: the GradScaler sequence (H4), unscaled by the fused kernel",
          "[precision][scaler]") {
  REQUIRE(accel::detail::compat::fused_unscale_available(c10::DeviceType::CPU));
  check_grad_scaler_sequence<accel::fp16>();
}
#endif

TEST_CASE("fp16 loss scaling defaults: 65536, x2 after 2000 clean steps, and H5", "[precision][scaler]") {
  accel::accelerator<scaled_fp32> acc{{.cpu = true}};
  const auto& scaler = acc.precision().scaler();
  CHECK(scaler.state().scale == 65536.0f);
  CHECK(scaler.options().growth_factor == 2.0);
  CHECK(scaler.options().backoff_factor == 0.5);
  CHECK(scaler.options().growth_interval == 2000);
  auto w = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD optimizer({w}, 1e-3);
  auto opt = acc.prepare(optimizer);
  for (int i = 0; i < 1999; ++i) {
    acc.backward(w.sum());
    opt.step();
    opt.zero_grad();
  }
  CHECK(scaler.state().scale == 65536.0f);
  acc.backward(w.sum());
  opt.step();
  CHECK(scaler.state().scale == 131072.0f);
  CHECK(scaler.state().growth_tracker == 0);
  CHECK_THROWS_WITH(accel::accelerator<scaled_fp32>(accel::options{.grad_scaler = {.backoff_factor = 2}}),
                    Catch::Contains("0 < backoff_factor < 1"));
  // H5: GradScalerKwargs(init_scale=1024, growth_factor=2) keeps the defaults of the others.
  accel::accelerator<scaled_fp32> partly{{.cpu = true, .grad_scaler = {.init_scale = 1024, .growth_factor = 2}}};
  CHECK(partly.precision().scaler().state().scale == 1024.0f);
  CHECK(partly.precision().scaler().options().backoff_factor == 0.5);
  CHECK(partly.precision().scaler().options().growth_interval == 2000);
}

TEST_CASE("clip_grad_norm_ under fp16 + accumulate<4> sees the unscaled gradient, unscaled once",
          "[precision][scaler]") {
  constexpr int N = 4;
  accel::accelerator<scaled_fp32, accel::single_process, accel::accumulate<N>> acc{{.cpu = true}};
  torch::manual_seed(6);
  auto net = mlp(3, 8, 2);
  auto reference = mlp(3, 8, 2);
  copy_parameters(*reference, *net);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  torch::optim::SGD reference_optimizer(reference->parameters(), 0.1);
  auto data = regression_batches(N, 4, 3, 2, 9);
  // The reference: the same window in float32, no scaling, clipped to half its norm.
  for (auto& [x, y] : data) (torch::mse_loss(reference->forward(x), y) / N).backward();
  const double reference_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), 1e9);
  torch::nn::utils::clip_grad_norm_(reference->parameters(), reference_norm / 2);
  reference_optimizer.step();

  auto [model, opt] = acc.prepare(net, optimizer);
  double norm = 0;
  for (auto& [x, y] : data) {
    auto scope = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(x), y));
    if (!acc.sync_gradients()) {
      auto before = grads_of(*net);
      acc.clip_grad_norm_(net->parameters(), 1e-9);  // mid-window: nothing is clipped or unscaled
      auto after = grads_of(*net);
      for (std::size_t i = 0; i < before.size(); ++i) CHECK(torch::equal(before[i], after[i]));
      continue;
    }
    norm = acc.clip_grad_norm_(net->parameters(), reference_norm / 2);
    acc.unscale_gradients();  // a second unscale in the same step does nothing
    opt.step();
    opt.zero_grad();
  }
  CHECK(norm == Approx(reference_norm).epsilon(1e-5));
  CHECK_FALSE(acc.optimizer_step_was_skipped());
  for (std::size_t i = 0; i < net->parameters().size(); ++i)
    CHECK(torch::allclose(net->parameters()[i], reference->parameters()[i], 1e-6, 1e-6));
}

TEST_CASE("clip_grad_norm_ and clip_grad_value_ with fp32 are LibTorch's", "[precision]") {
  accel::accelerator<> acc{{.cpu = true}};
  torch::manual_seed(8);
  auto net = mlp(3, 8, 2);
  auto reference = mlp(3, 8, 2);
  copy_parameters(*reference, *net);
  auto model = acc.prepare(net);
  auto x = torch::randn({5, 3});
  model(x).pow(2).sum().backward();
  reference->forward(x).pow(2).sum().backward();
  CHECK(acc.clip_grad_norm_(net->parameters(), 0.1) ==
        Approx(torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.1)));
  acc.clip_grad_value_(net->parameters(), 0.01);
  torch::nn::utils::clip_grad_value_(reference->parameters(), 0.01);
  for (std::size_t i = 0; i < net->parameters().size(); ++i)
    CHECK(torch::equal(net->parameters()[i].grad(), reference->parameters()[i].grad()));
}

TEST_CASE("fp16: an optimizer that did not step starts its next step afresh, fp16 losses are promoted",
          "[precision][scaler]") {
  accel::accelerator<scaled_fp32> acc{{.cpu = true}};
  auto a = torch::zeros({1}, torch::requires_grad());
  auto b = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD first({a}, 1.0), second({b}, 1.0);
  auto [opt_a, opt_b] = acc.prepare(first, second);
  // Iteration 1: both unscaled (clipping would do that), only the first steps.
  acc.backward((a + b).sum());
  acc.unscale_gradients();
  opt_a.step();
  opt_a.zero_grad();
  opt_b.zero_grad();
  CHECK(a.item<float>() == -1.0f);
  // Iteration 2: the second steps; its gradient is scaled again and must be unscaled again.
  acc.backward((a + b).sum());
  opt_b.step();
  CHECK(b.item<float>() == -1.0f);
  CHECK_FALSE(acc.optimizer_step_was_skipped());
  // A float16 loss: as with PyTorch's GradScaler, it is scaled in float32, but 65536 itself does not fit
  // float16, so the gradient flowing back into float16 overflows, the step is skipped and the scale backs off.
  opt_b.zero_grad();
  acc.backward((b.to(torch::kHalf) * 4).sum());
  opt_b.step();
  CHECK(acc.optimizer_step_was_skipped());
  CHECK(acc.precision().scaler().state().scale == 32768.0f);
  opt_b.zero_grad();
  acc.backward(b.to(torch::kHalf).sum());
  opt_b.step();
  CHECK_FALSE(acc.optimizer_step_was_skipped());
  CHECK(b.item<float>() == -2.0f);
}

TEST_CASE("unscale_gradients does nothing on a micro-step that does not synchronise", "[precision][scaler]") {
  accel::accelerator<scaled_fp32, accel::single_process, accel::accumulate<2>> acc{{.cpu = true}};
  auto w = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD optimizer({w}, 1.0);
  auto opt = acc.prepare(optimizer);
  {
    auto scope = acc.accumulate();
    acc.backward(w.sum());
    acc.unscale_gradients();
    CHECK(w.grad().item<float>() == 65536.0f / 2);  // still scaled
  }
  {
    auto scope = acc.accumulate();
    acc.backward(w.sum());
    opt.step();
  }
  CHECK(w.item<float>() == -1.0f);  // (1/2 + 1/2) unscaled once
}
