// For tests/scripts/fp8_reference.py: `fp8_layer RECIPE FILE [cuda]` trains one Linear(32, 48) converted by accel::fp8
// with RECIPE (tensorwise, rowwise or delayed through at::_scaled_mm; tensorwise_emulated: options::fp8.emulate) for 3
// SGD steps on fixed inputs and output gradients, and writes to FILE (safetensors) what the reference recomputes with
// PyTorch's own ops: the inputs and starting weights, the first step's float8 casts and scales (as accel::detail::fp8
// computes them), and each step's output, input gradient, weight and bias gradients (and with delayed scaling the amax
// history and scales after the step). With `cuda` the layer runs on the GPU (the tensors are made on the CPU, then
// moved; FILE holds CPU copies).
#include "accel_headers.hpp"
#include <torch/torch.h>

#include <iostream>
#include <string>

namespace programs::fp8_layer {

#if ACCEL_HAS_FLOAT8
namespace {

namespace f = accel::detail::fp8;

template <class Recipe>
int run(const std::string& file, bool emulate, bool cuda) {
  accel::options options{.cpu = !cuda};
  options.fp8.amax_history_len = 2;
  options.fp8.emulate = emulate;  // at::_scaled_mm on the CPU too, unless asked
  options.fp8.module_filter_func = [](const torch::nn::Module&, const std::string&) { return true; };
  accel::accelerator<accel::fp8<Recipe>> acc(options);
  torch::manual_seed(0);
  torch::nn::Linear net(32, 48);
  accel::safetensors::tensor_list out{{"weight", net->weight.detach().clone()}, {"bias", net->bias.detach().clone()}};
  torch::optim::SGD sgd(net->parameters(), 0.5);
  auto [model, opt] = acc.prepare(net, sgd);
  if (acc.precision().converted_layers().size() != 1) return 3;

  // The first step's casts, by the functions the layer runs (24 rows: the weight gradient's reduction is padded).
  const auto on_device = [&](const at::Tensor& t) { return t.to(acc.device()); };
  const auto x0 = on_device(torch::randn({24, 32}) * 4);
  const auto x16 = x0.to(torch::kBFloat16);
  const bool rows = std::is_same_v<Recipe, accel::rowwise_scaling>;
  const auto axis = rows ? std::optional<int64_t>(1) : std::nullopt;
  const auto e4m3 = torch::kFloat8_e4m3fn;
  const auto x8 = f::cast_dynamic(x16, e4m3, axis, rows), w8 = f::cast_dynamic(net->weight, e4m3, axis, rows);
  out.insert(out.end(), {{"x8", x8.data.view(torch::kByte)},
                         {"x_scale", x8.scale},
                         {"w8", w8.data.view(torch::kByte)},
                         {"w_scale", w8.scale}});

  for (int step = 0; step < 3; ++step) {
    const auto name = [&](const char* what) { return std::string(what) + "_" + std::to_string(step); };
    const auto x = (step == 0 ? x0 : on_device(torch::randn({24, 32}) * (step + 1))).requires_grad_();
    const auto g = on_device(torch::randn({24, 48}) * 1e-3);
    const auto y = model(x);
    y.backward(g);
    out.insert(out.end(), {{name("x"), x.detach()},
                           {name("g"), g},
                           {name("y"), y.detach()},
                           {name("x_grad"), x.grad()},
                           {name("w_grad"), net->weight.grad().clone()},
                           {name("b_grad"), net->bias.grad().clone()}});
    opt.step();
    opt.zero_grad();
    if constexpr (std::is_same_v<Recipe, accel::delayed_scaling>)
      out.insert(out.end(), {{name("history"), acc.precision().scaling_state().history().clone()},
                             {name("scales"), acc.precision().scaling_state().scales().clone()}});
  }
  out.emplace_back("weight_end", net->weight.detach().clone());
  for (auto& entry : out) entry.second = entry.second.cpu();
  accel::safetensors::save(file, out);
  return 0;
}

}  // namespace
#endif

int run(int argc, char** argv) {
#if !ACCEL_HAS_FLOAT8
  (void)argc, (void)argv;
  std::cerr << "fp8_layer: this LibTorch has no float8 (accel::fp8 needs 2.4 or newer)\n";
  return 77;
#else
  const bool cuda = argc == 4 && std::string(argv[3]) == "cuda";
  const std::string recipe = argc == 3 || cuda ? argv[1] : "";
  if (cuda && !torch::cuda::is_available()) {
    std::cerr << "skipped: no GPU\n";
    return 77;
  }
  if (recipe == "tensorwise") return run<accel::tensorwise_scaling>(argv[2], false, cuda);
  if (recipe == "tensorwise_emulated") return run<accel::tensorwise_scaling>(argv[2], true, cuda);
#if ACCEL_TORCH_VERSION < 213
  if (recipe == "rowwise" && !cuda) {  // accel::fp8<rowwise_scaling> refuses it there (unit.* checks the refusal)
    std::cerr << "skipped: the CPU's at::_scaled_mm takes rowwise scales from LibTorch 2.13 on\n";
    return 77;
  }
#endif
  if (recipe == "rowwise") return run<accel::rowwise_scaling>(argv[2], false, cuda);
  if (recipe == "delayed") return run<accel::delayed_scaling>(argv[2], false, cuda);
  std::cerr << "usage: fp8_layer tensorwise|tensorwise_emulated|rowwise|delayed FILE [cuda]\n";
  return 2;
#endif
}

}  // namespace programs::fp8_layer
