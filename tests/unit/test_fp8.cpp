// accel::fp8: which layers convert, what their matmuls compute, delayed scaling's rules, checkpoints, dispatch.
// The arithmetic is compared bit for bit with PyTorch's own ops by tests/scripts/fp8_reference.py
// (fp8.python_reference).
#include "support.hpp"  // first: LibTorch defines a CHECK of its own, which Catch's must replace

#include <accel/detail/fp8/cast_kernel.hpp>  // the cast kernel and its launcher: compiled mode's accel.hpp has neither
#include <accel/detail/fp8/cuda_casts.hpp>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fp8_tower.hpp"

#if ACCEL_HAS_FLOAT8

namespace {

using namespace accel_test;

/// Five Linear layers: the first and last (left in bfloat16 by default), two of suitable shapes, one of 40 outputs
/// (not a multiple of 16: never converted).
struct stack_impl : torch::nn::Module {
  stack_impl()
      : first(register_module("first", torch::nn::Linear(16, 32))),
        hidden(register_module("hidden", torch::nn::Linear(32, 64))),
        odd(register_module("odd", torch::nn::Linear(64, 40))),
        wide(register_module("wide", torch::nn::Linear(64, 48))),
        last(register_module("last", torch::nn::Linear(48, 8))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(hidden(torch::relu(first(x))));
    return last(torch::relu(wide(h))) + odd(h).mean(-1, true);
  }
  torch::nn::Linear first, hidden, odd, wide, last;
};
TORCH_MODULE_IMPL(stack, stack_impl);

using accel_test::tower;

using fp8_tensorwise = accel::accelerator<accel::fp8<>>;
using fp8_delayed = accel::accelerator<accel::fp8<accel::delayed_scaling>>;

/// The float8 matmul of one layer, written out from the casts (the tensorwise recipe).
torch::Tensor tensorwise_linear(const torch::Tensor& x, const torch::nn::Linear& layer, bool emulate) {
  namespace f = accel::detail::fp8;
  const auto x16 = x.to(torch::kBFloat16);
  const auto x8 = f::cast_dynamic(x16, torch::kFloat8_e4m3fn, std::nullopt, false);
  const auto w8 = f::cast_dynamic(layer->weight, torch::kFloat8_e4m3fn, std::nullopt, false);
  return f::scaled_mm(x8, {w8.data.t(), w8.scale}, torch::kBFloat16, true, true, emulate) +
         layer->bias.to(torch::kBFloat16);
}

}  // namespace

TEST_CASE("fp8 casts: torchao's scale from the amax, saturation, powers of 2", "[fp8]") {
  namespace f = accel::detail::fp8;
  const auto x = torch::tensor({0.5f, -3.0f, 2.0f, 1.0f});
  const auto cast = f::cast_dynamic(x, torch::kFloat8_e4m3fn, std::nullopt, false);
  CHECK(cast.scale.item<float>() == static_cast<float>(448.0 / 3.0));  // in float64, then float32
  CHECK(cast.data.scalar_type() == torch::kFloat8_e4m3fn);
  CHECK(cast.data.to(torch::kFloat)[1].item<float>() == -448.0f);  // the amax lands on the largest value
  // A value past the range saturates instead of becoming NaN; a zero tensor gets the scale of amax 1e-12.
  CHECK(f::cast(torch::tensor({1000.0f}), torch::tensor(1.0f), torch::kFloat8_e5m2).to(torch::kFloat).item<float>() ==
        1024.0f);  // the nearest e5m2
  CHECK(f::cast(torch::tensor({1e6f}), torch::tensor(1.0f), torch::kFloat8_e5m2).to(torch::kFloat).item<float>() ==
        57344.0f);
  CHECK(f::amax_to_scale(torch::tensor(0.0f), torch::kFloat8_e4m3fn, false).item<float>() ==
        static_cast<float>(448.0 / 1e-12));
  // Rowwise: one scale per row, rounded down to a power of 2 (448 / 3 = 149.3 -> 128; 448 / 0.5 = 896 -> 512).
  const auto rows = f::cast_dynamic(torch::tensor({{1.0f, -3.0f}, {0.5f, 0.25f}}), torch::kFloat8_e4m3fn, 1, true);
  CHECK(torch::equal(rows.scale, torch::tensor({{128.0f}, {512.0f}})));
}

TEST_CASE("fp8 casts: a scale from the tensor's own amax needs no clamp, the bits are the saturating cast's", "[fp8]") {
  namespace f = accel::detail::fp8;
  const auto bits = [](const torch::Tensor& t) { return t.view(torch::kUInt8); };
  // torchao's op sequence (`hp_tensor_and_scale_to_float8`): float32 product, clamp, float8 copy.
  const auto saturating = [](const torch::Tensor& x, const torch::Tensor& scale, c10::ScalarType dtype) {
    const double top = f::largest(dtype);
    return (x.to(torch::kFloat) * scale).clamp(-top, top).to(dtype);
  };
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  int compared = 0;
  for (const auto input_type : {torch::kBFloat16, torch::kFloat})
    for (const auto dtype : {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2})
      for (const std::optional<int64_t> axis :
           {std::optional<int64_t>{}, std::optional<int64_t>{0}, std::optional<int64_t>{1}})
        for (int k = 0; k < 20; ++k) {
          // Rows of magnitudes from 1e-16 (below amax_to_scale's floor of 1e-12) to 1e10, and a zero tensor.
          const auto magnitudes = torch::pow(10.0, torch::empty({33, 1}).uniform_(-16, 10, generator));
          const auto x = k == 0 ? torch::zeros({33, 48}, input_type)
                                : (torch::randn({33, 48}, generator) * magnitudes).to(input_type);
          const auto max = f::amax(x, axis);
          INFO("input " << input_type << ", " << dtype << ", axis " << axis.value_or(-1) << ", round " << k);
          REQUIRE(torch::equal(max, axis ? x.abs().amax(*axis, true) : x.abs().max()));  // one pass, same values
          const auto scale = f::amax_to_scale(max, dtype, axis.has_value());
          CHECK(torch::equal(bits(f::cast_in_range(x, scale, dtype)), bits(saturating(x, scale, dtype))));
          // A scale too large for x (delayed scaling's, a step old) saturates: the clamp writes float8 as it stores.
          CHECK(torch::equal(bits(f::cast(x, scale * 3, dtype)), bits(saturating(x, scale * 3, dtype))));
          ++compared;
        }
  CHECK(compared == 2 * 2 * 3 * 20);
}

TEST_CASE(
    "fp8 cast kernel: its rounding and saturation, run on the CPU, are ATen's clamp and cast for every bfloat16 "
    "and float16 value and 2^20 float32 bit patterns",
    "[fp8]") {
  namespace f = accel::detail::fp8;
  const auto bits = [](const torch::Tensor& t) { return t.view(torch::kUInt8); };
  const auto every_16_bit_value = torch::arange(-32768, 32768, torch::kInt).to(torch::kShort).reshape({4096, 16});
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto float32_patterns = torch::randint(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                                               {65536, 16}, generator, torch::kInt)
                                    .view(torch::kFloat);
  int compared = 0;
  for (const auto dtype : {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2})
    // 1: the values themselves (NaNs, infinities, float8's subnormals); 3.7: many beyond the range, saturated;
    // 2^-20: most into float8's subnormals or to zero.
    for (const float factor : {1.0f, 3.7f, 0x1p-20f})
      for (const auto& x :
           {every_16_bit_value.view(torch::kBFloat16), every_16_bit_value.view(torch::kHalf), float32_patterns}) {
        const auto scale = torch::full({}, factor);
        INFO(x.scalar_type() << " to " << dtype << ", scale " << factor);
        CHECK(torch::equal(bits(f::kernel::on_host(x, scale, dtype).first), bits(f::cast(x, scale, dtype))));
        ++compared;
      }
  CHECK(compared == 2 * 3 * 3);
}

TEST_CASE("fp8 cast kernel: both layouts, tile by tile, for rows and columns that fill no tile", "[fp8]") {
  namespace f = accel::detail::fp8;
  const auto bits = [](const torch::Tensor& t) { return t.view(torch::kUInt8); };
  for (const auto type : {torch::kBFloat16, torch::kFloat, torch::kHalf})
    for (const auto dtype : {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2})
      for (const auto& [rows, cols] :
           {std::pair<int64_t, int64_t>{1, 16}, {37, 48}, {64, 64}, {130, 208}, {16, 80}, {200, 16}}) {
        const auto x = (torch::randn({rows, cols}) * 300).to(type);
        const auto scale = torch::full({}, 1.5f);
        INFO(type << " to " << dtype << ", " << rows << " x " << cols);
        REQUIRE(f::kernel::takes(x));
        const auto [row_major, transposed] = f::kernel::on_host(x, scale, dtype);
        const auto expected = f::cast(x, scale, dtype);
        CHECK(torch::equal(bits(row_major), bits(expected)));
        CHECK(transposed.is_contiguous());
        CHECK(torch::equal(bits(transposed), bits(expected.t().contiguous())));
      }
  // What it leaves to ATen: columns not in whole 16-byte chunks, a strided view, integers, a vector.
  CHECK_FALSE(f::kernel::takes(torch::randn({4, 40})));
  CHECK_FALSE(f::kernel::takes(torch::randn({32, 16}).t()));
  CHECK_FALSE(f::kernel::takes(torch::ones({4, 16}, torch::kInt)));
  CHECK_FALSE(f::kernel::takes(torch::randn({16})));
  // On the CPU the casts are ATen's, in one layout.
  CHECK_FALSE(f::kernel::cast_both_layouts(torch::randn({16, 16}), torch::ones({}), torch::kFloat8_e4m3fn));
  CHECK_FALSE(f::cast_dynamic(torch::randn({16, 16}), torch::kFloat8_e4m3fn, std::nullopt, false).transposed.defined());
}

TEST_CASE("fp8 cast kernel: a Linear's three float8 matmuls take the transposes it writes as they take their own",
          "[fp8]") {
  // What linear_function does with the casts on CUDA, with the kernel's layouts made here by its code on the CPU:
  // the forward's weight transposed, the backward's right operands as saved, the gradient transposed.
  namespace f = accel::detail::fp8;
  const auto e4m3 = torch::kFloat8_e4m3fn, e5m2 = torch::kFloat8_e5m2;
  const auto both = [](const torch::Tensor& x, c10::ScalarType dtype) {
    const auto plain = f::cast_dynamic(x, dtype, std::nullopt, false);
    const auto [data, transposed] = f::kernel::on_host(x, plain.scale, dtype);
    return std::pair{plain, f::scaled{data, plain.scale, transposed}};
  };
  for (const bool pad : {false, true}) {
    const auto x = torch::randn({24, 32}).to(torch::kBFloat16), weight = torch::randn({48, 32});
    const auto g = (torch::randn({24, 48}) * 1e-3).to(torch::kBFloat16);
    const auto [x8, x8k] = both(x, e4m3);
    const auto [w8, w8k] = both(weight, e4m3);
    const auto [g8, g8k] = both(g, e5m2);
    REQUIRE(x8k.transposed.defined());
    const auto same = [](const torch::Tensor& a, const torch::Tensor& b) { return torch::equal(a, b); };
    const auto bf16 = torch::kBFloat16;
    INFO("pad_inner_dim " << pad);
    CHECK(same(f::scaled_mm(x8k, w8k.t(), bf16, true, pad), f::scaled_mm(x8, w8.t(), bf16, true, pad)));
    const f::scaled w_saved{w8k.right_operand(), w8k.scale}, x_saved{x8k.right_operand(), x8k.scale};
    CHECK_FALSE(w_saved.data.is_contiguous());  // column-major: no copy to make
    CHECK(same(f::scaled_mm(g8k, w_saved, bf16, false, pad), f::scaled_mm(g8, w8, bf16, false, pad)));
    CHECK(same(f::scaled_mm(g8k.t(), x_saved, bf16, false, pad), f::scaled_mm(g8.t(), x8, bf16, false, pad)));
  }
}

TEST_CASE("fp8 converts the Linear layers of suitable shapes but the first and last, or as a filter decides", "[fp8]") {
  fp8_tensorwise acc{{.cpu = true}};
  stack net;
  const auto identities = parameter_identities(*net);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  CHECK((acc.precision().converted_layers() == std::vector<std::string>{"hidden", "wide"}));
  CHECK(parameter_identities(*net) == identities);  // the optimizer's parameters are the model's still

  accel::options chosen{.cpu = true};
  chosen.fp8.module_filter_func = [](const torch::nn::Module& linear, const std::string& name) {
    CHECK(dynamic_cast<const torch::nn::LinearImpl*>(&linear) != nullptr);
    return name != "hidden";  // "last" is asked too, and refused by its shape before (8 outputs)
  };
  accel::accelerator<accel::fp8<>> filtered(chosen);
  stack other;
  auto prepared = filtered.prepare(other);
  CHECK((filtered.precision().converted_layers() == std::vector<std::string>{"first", "wide"}));
}

TEST_CASE(
    "fp8 computes a converted layer in float8, in bfloat16 out, the others as bf16 does, and unwrap_model gives the "
    "user's modules back",
    "[fp8]") {
  fp8_tensorwise acc{{.cpu = true}};
  torch::manual_seed(3);
  tower net;
  auto model = acc.prepare(net);
  const auto x = torch::randn({24, 32});
  torch::Tensor inside, plain_a;
  {
    auto scope = acc.autocast();  // the forward scope of every model(x)
    inside = net->a(x);
    plain_a = net->first(torch::randn({24, 16}));
  }
  CHECK(inside.scalar_type() == torch::kBFloat16);
  // On the CPU the matmul is emulated unless options::fp8.emulate says otherwise (LibTorch's CPU _scaled_mm is slow):
  // the same float8 products, summed in another order than _scaled_mm's.
  CHECK(torch::equal(inside, tensorwise_linear(x, net->a, true)));
  CHECK(torch::allclose(inside.to(torch::kFloat), tensorwise_linear(x, net->a, false).to(torch::kFloat), 1e-2, 1e-2));
  CHECK(plain_a.scalar_type() == torch::kBFloat16);  // autocast, as bf16
  // Outside the scope the user's module is LibTorch's Linear again, the same object with the same weights.
  auto unwrapped = acc.unwrap_model(model);
  CHECK(unwrapped.ptr() == net.ptr());
  CHECK(torch::equal(unwrapped->a(x), torch::nn::functional::linear(x, net->a->weight, net->a->bias)));
  // The model's output comes back in float32 and close to the float32 model's (float8 has 3 mantissa bits).
  const auto y = model(torch::randn({8, 16}));
  CHECK(y.scalar_type() == torch::kFloat);
}

TEST_CASE(
    "fp8: LibTorch's Linear adds the bias in place to a 3-D input's product, which autograd records as an add, not a "
    "copy of the gradient",
    "[fp8]") {
  fp8_tensorwise acc{{.cpu = true}};
  torch::manual_seed(4);
  tower net;
  auto model = acc.prepare(net);
  const auto x = torch::randn({2, 12, 32}), upstream = torch::randn({2, 12, 64});
  const auto forward_backward = [&](const torch::Tensor& input, const torch::Tensor& gradient) {
    net->zero_grad();
    torch::Tensor out;
    {
      auto scope = acc.autocast();
      out = net->a(input);  // 3-D: F::linear's matmul, then `output += bias`; 2-D: addmm
    }
    out.backward(gradient.to(out.scalar_type()));
    return std::pair{out, net->a->weight.grad().clone()};
  };
  const auto [out, weight_gradient] = forward_backward(x, upstream);
  CHECK(out.scalar_type() == torch::kBFloat16);
  CHECK_FALSE(out.is_view());
  CHECK(out.grad_fn()->name() == "AddBackward0");  // on a view, CopySlices: the gradient copied and zeroed
  // The weight's gradient is the 2-D input's, bit for bit: the same float8 matmuls of the same operands.
  const auto [flat_out, flat_weight_gradient] = forward_backward(x.reshape({24, 32}), upstream.reshape({24, 64}));
  CHECK(flat_out.grad_fn()->name() != "CopySlices");
  CHECK(torch::equal(weight_gradient, flat_weight_gradient));
}

TEST_CASE("fp8 trains: gradients reach every parameter in its master type, loss falls like bf16's", "[fp8]") {
  auto train = [](auto& acc) {
    torch::manual_seed(5);
    tower net;
    torch::optim::AdamW adamw(net->parameters(), 1e-2);
    auto [model, opt] = acc.prepare(net, adamw);
    auto data = regression_batches(8, 64, 16, 4, 11);
    double last = 0;
    for (int epoch = 0; epoch < 10; ++epoch)
      for (auto& [x, y] : data) {
        auto loss = torch::mse_loss(model(x), y);
        acc.backward(loss);
        for (auto& p : net->parameters()) REQUIRE((p.grad().defined() && p.grad().scalar_type() == torch::kFloat));
        opt.step();
        opt.zero_grad();
        last = loss.template item<double>();
      }
    return last;
  };
  accel::accelerator<accel::bf16> bf16{{.cpu = true}};
  fp8_tensorwise tensorwise{{.cpu = true}};
  fp8_delayed delayed(accel::options{.cpu = true, .fp8 = {.amax_history_len = 16}});
  const double reference = train(bf16);
  INFO("bf16 " << reference);
  CHECK(train(tensorwise) < reference * 1.5);
  CHECK(train(delayed) < reference * 1.5);
  using fp8_rowwise = accel::accelerator<accel::fp8<accel::rowwise_scaling>>;
#if ACCEL_TORCH_VERSION >= 213  // the CPU's _scaled_mm takes rowwise scales from LibTorch 2.13 (2.11's does not)
  fp8_rowwise rowwise{{.cpu = true}};
  CHECK(train(rowwise) < reference * 1.5);
#else
  CHECK_THROWS_WITH(fp8_rowwise({.cpu = true}), Catch::Contains("cannot multiply Float8_e4m3fn by Float8_e4m3fn with "
                                                                "rowwise scales on cpu"));
#endif
}

TEST_CASE("fp8 delayed scaling: TransformerEngine's amax history rules", "[fp8]") {
  namespace f = accel::detail::fp8;
  const auto record_and_update = [](f::amax_history& h, float amax) {
    f::amax_history::record(h.slot(0), torch::tensor(amax));
    h.update();
    return h.scales()[0].item<float>();
  };
  SECTION("max over the last amax_history_len updates; the scale stays 1 until an amax is seen") {
    f::amax_history h({.amax_history_len = 3}, torch::kCPU);
    h.add(448.0);
    CHECK(h.scales()[0].item<float>() == 1.0f);
    h.update();  // nothing recorded: amax 0 keeps the scale
    CHECK(h.scales()[0].item<float>() == 1.0f);
    CHECK(record_and_update(h, 4.0f) == 112.0f);
    CHECK(record_and_update(h, 2.0f) == 112.0f);  // 4 is still in the window
    CHECK(record_and_update(h, 1.0f) == 112.0f);
    CHECK(record_and_update(h, 1.0f) == 224.0f);  // 4 has left it (3 updates later): max(2, 1, 1)
    CHECK(record_and_update(h, 1.0f) == 448.0f);
  }
  SECTION("the history rolls towards row 0, which is zeroed: row 0 of TransformerEngine's buffer is the current step") {
    f::amax_history h({.amax_history_len = 3}, torch::kCPU);
    h.add(448.0);
    for (float a : {5.0f, 6.0f}) record_and_update(h, a);
    CHECK(torch::equal(h.history().flatten(), torch::tensor({0.0f, 5.0f, 6.0f})));
    record_and_update(h, 7.0f);
    CHECK(torch::equal(h.history().flatten(), torch::tensor({0.0f, 6.0f, 7.0f})));
  }
  SECTION("most_recent uses row 0 alone; margin divides by 2^margin; several records in a step keep the largest") {
    f::amax_history h({.amax_history_len = 4, .amax_compute_algo = accel::amax_compute_algo::most_recent, .margin = 2},
                      torch::kCPU);
    h.add(57344.0);  // an e5m2 column
    CHECK(record_and_update(h, 8.0f) == 57344.0f / 8 / 4);
    f::amax_history::record(h.slot(0), torch::tensor(2.0f));
    f::amax_history::record(h.slot(0), torch::tensor(1.0f));
    h.update();
    CHECK(h.scales()[0].item<float>() == 57344.0f / 2 / 4);
  }
  SECTION("an amax of inf or NaN keeps the last scale") {
    f::amax_history h({.amax_history_len = 1}, torch::kCPU);
    h.add(448.0);
    CHECK(record_and_update(h, 2.0f) == 224.0f);
    CHECK(record_and_update(h, std::numeric_limits<float>::infinity()) == 224.0f);
    CHECK(record_and_update(h, 4.0f) == 112.0f);  // a window of 1: inf is gone
  }
  SECTION("bad settings are refused, naming the option") {
    CHECK_THROWS_WITH(f::amax_history({.amax_history_len = 0}, torch::kCPU),
                      Catch::Contains("options.fp8.amax_history_len must be at least 1"));
    CHECK_THROWS_WITH(f::amax_history({.margin = -1}, torch::kCPU), Catch::Contains("options.fp8.margin"));
  }
}

// fp8.delayed_scaling.tiny_amax (a CTest test of its own): an amax positive but below largest / float32's max gave an
// infinite scale, and the next cast turned every zero into NaN.
TEST_CASE("fp8 delayed scaling: a tiny positive amax gives float32's largest scale, as TransformerEngine",
          "[.fp8_tiny_amax]") {
  namespace f = accel::detail::fp8;
  for (const auto& [format, largest] :
       {std::pair{torch::kFloat8_e4m3fn, 448.0}, std::pair{torch::kFloat8_e5m2, 57344.0}}) {
    f::amax_history h({.amax_history_len = 2}, torch::kCPU);
    h.add(largest);
    f::amax_history::record(h.slot(0), torch::tensor(1e-38f));  // 448 / 1e-38 = 4.5e40: past float32
    h.update();
    const auto scale = h.scales()[0];
    CHECK(scale.item<float>() == std::numeric_limits<float>::max());
    const auto cast = f::cast(torch::tensor({0.0f, 1e-38f, -1e-38f}), scale, format);
    CHECK_FALSE(torch::isnan(cast.to(torch::kFloat)).any().item<bool>());
    CHECK(cast.to(torch::kFloat)[0].item<float>() == 0.0f);
    f::amax_history::record(h.slot(0), torch::tensor(2.0f));  // an ordinary amax afterwards: the ordinary scale
    h.update();
    CHECK(h.scales()[0].item<float>() == static_cast<float>(largest / 2));
  }
}

TEST_CASE("fp8 delayed scaling in training: one update per optimizer step, the casts use the step before's scales",
          "[fp8]") {
  fp8_delayed acc(accel::options{.cpu = true, .fp8 = {.amax_history_len = 2}});
  torch::manual_seed(2);
  tower net;
  torch::optim::SGD sgd(net->parameters(), 0.01);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto& state = acc.precision().scaling_state();
  REQUIRE(state.scales().size(0) == 6);  // a and b: input, weight, gradient each
  const auto x = torch::randn({32, 16});
  auto loss = model(x).pow(2).mean();
  acc.backward(loss);
  CHECK(torch::equal(state.scales(), torch::ones({6})));  // not updated before the step
  const auto weight_amax = net->a->weight.abs().max();
  opt.step();
  // Column 1 is layer a's weight: e4m3, its amax the weight's before the step.
  CHECK(state.scales()[1].item<float>() == (torch::tensor(448.0f) / weight_amax).item<float>());
  CHECK(state.scales()[2].item<float>() != 1.0f);  // the gradient's (e5m2) was recorded in backward
  CHECK(torch::equal(state.history()[0], torch::zeros({6})));
}

TEST_CASE("fp8 delayed scaling resumes bit for bit: amax histories and scales are in the checkpoint", "[fp8]") {
  const auto dir = scratch_directory("fp8_resume");
  const accel::options opts{.cpu = true, .fp8 = {.amax_history_len = 3}};
  const auto data = regression_batches(10, 32, 16, 4, 9);
  auto run = [&](fp8_delayed& acc, tower& net, torch::optim::AdamW& adamw, int from, int to, bool save) {
    auto [model, opt] = acc.prepare(net, adamw);
    if (!save && from > 0) acc.load_state(dir);
    for (int i = from; i < to; ++i) {
      acc.backward(torch::mse_loss(model(data[i].first), data[i].second));
      opt.step();
      opt.zero_grad();
      if (save && i + 1 == 5) acc.save_state(dir);
    }
  };
  torch::manual_seed(4);
  tower straight;
  torch::optim::AdamW straight_opt(straight->parameters(), 1e-2);
  fp8_delayed first(opts);
  run(first, straight, straight_opt, 0, 10, true);

  torch::manual_seed(99);
  tower resumed;
  torch::optim::AdamW resumed_opt(resumed->parameters(), 1e-2);
  fp8_delayed second(opts);
  run(second, resumed, resumed_opt, 5, 10, false);
  CHECK(bitwise_equal(*straight, *resumed));
  CHECK(torch::equal(first.precision().scaling_state().history(), second.precision().scaling_state().history()));
  CHECK(torch::equal(first.precision().scaling_state().scales(), second.precision().scaling_state().scales()));

  // A checkpoint without the state (bf16's) is refused, and nothing changes.
  accel::accelerator<accel::bf16> plain{{.cpu = true}};
  tower other;
  auto other_model = plain.prepare(other);
  plain.save_state(dir / "bf16");
  const auto scales = second.precision().scaling_state().scales().clone();
  const auto weights = resumed->parameters()[0].clone();
  CHECK_THROWS_WITH(second.load_state(dir / "bf16"), Catch::Contains("lacks the fp8 delayed scaling state"));
  CHECK(torch::equal(second.precision().scaling_state().scales(), scales));
  CHECK(torch::equal(resumed->parameters()[0], weights));
  accel::detail::remove_tree(dir);
}

TEST_CASE("fp8 is chosen by ACCELERATE_MIXED_PRECISION=fp8 and the config file, and bad settings are refused",
          "[fp8]") {
  using supported = accel::configs<accel::accelerator<>, accel::accelerator<accel::bf16>, fp8_delayed>;
  accel::run_config config;
  config.mixed_precision = "fp8";
  const auto chosen =
      accel::dispatch<supported>(config, [](auto& acc) { return std::string(acc.precision().name()); }, {.cpu = true});
  CHECK(chosen == "fp8<delayed_scaling>");
  accel::config_values values;
  accel::set_config_value(values, "mixed_precision", "fp8", "ACCELERATE_MIXED_PRECISION");
  CHECK(values.mixed_precision == "fp8");

  using rowwise = accel::accelerator<accel::fp8<accel::rowwise_scaling>>;
  CHECK_THROWS_WITH(rowwise(accel::options{.cpu = true, .fp8 = {.fp8_format = accel::fp8_format::hybrid}}),
                    Catch::Contains("leave options.fp8.fp8_format unset or set it to fp8_format::e4m3"));
  CHECK_THROWS_WITH(fp8_delayed(accel::options{.cpu = true, .fp8 = {.amax_history_len = -3}}),
                    Catch::Contains("amax_history_len must be at least 1"));
}

TEST_CASE(
    "fp8's float8 all-gather: tensorwise only, its encoding casts slices as the whole weight, tied weights refused",
    "[fp8]") {
  namespace f = accel::detail::fp8;
  const accel::options gather{.cpu = true, .fp8 = {.enable_fsdp_float8_all_gather = true}};
  CHECK_THROWS_WITH(fp8_delayed(gather), Catch::Contains("enable_fsdp_float8_all_gather") &&
                                             Catch::Contains("use accel::fp8<accel::tensorwise_scaling>"));
  CHECK_THROWS_WITH(accel::accelerator<accel::fp8<accel::rowwise_scaling>>(gather),
                    Catch::Contains("torchao supports the float8 all-gather for that recipe only"));
  CHECK_FALSE(accel::fp8<>(accel::options{.cpu = true}, c10::Device(c10::kCPU)).gather_encoding());  // off by default

  fp8_tensorwise acc(gather);
  torch::manual_seed(0);
  tower net;
  auto model = acc.prepare(net);
  const auto encoding = acc.precision().gather_encoding();
  REQUIRE(encoding);
  CHECK(encoding->encodes(net->a->weight));
  CHECK(encoding->encodes(net->b->weight));
  CHECK_FALSE(encoding->encodes(net->first->weight));  // left in higher precision, gathered as before
  CHECK_FALSE(encoding->encodes(net->a->bias));
  CHECK(encoding->encoded_type() == at::kFloat8_e4m3fn);
  // Two slices encoded with the max of their amaxes are the whole weight's cast, bit for bit.
  const auto whole = net->a->weight.detach().reshape({-1});
  const auto left = whole.narrow(0, 0, 1000), right = whole.narrow(0, 1000, whole.numel() - 1000);
  const auto maximum = at::max(encoding->local_maximum(left), encoding->local_maximum(right));
  const auto encoded = at::cat({encoding->encode(left, maximum), encoding->encode(right, maximum)});
  const auto expected = f::cast_dynamic(whole, at::kFloat8_e4m3fn, std::nullopt, false);
  CHECK(torch::equal(encoded.view(at::kByte), expected.data.view(at::kByte)));
  CHECK(torch::equal(encoding->decode(encoded, maximum), expected.data.to(at::kFloat) / expected.scale));
  CHECK(encoding->local_maximum(whole.narrow(0, 0, 0)).item<float>() == 0);  // a process owning none
  // One process keeps its weights full: nothing is gathered, the layers cast as without the option.
  (void)model(torch::randn({8, 16}));
  CHECK_FALSE(acc.precision().gathered_weight("a"));

  struct tied_impl : torch::nn::Module {
    tied_impl() { register_parameter("shared", inner->a->weight); }
    tower inner = register_module("inner", tower());
  };
  fp8_tensorwise tying(gather);
  auto tied = std::make_shared<tied_impl>();
  CHECK_THROWS_WITH(tying.prepare(torch::nn::ModuleHolder<tied_impl>(tied)),
                    Catch::Contains("inner.a in float8 only, but it is also shared (a tied weight)"));
}

#else

TEST_CASE("fp8 needs LibTorch 2.4 or newer: this one has no float8 (compile_fail.fp8_without_float8 checks the error)",
          "[fp8]") {
  STATIC_REQUIRE(ACCEL_TORCH_VERSION < 204);
}

#endif
