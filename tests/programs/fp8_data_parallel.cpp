// fp8.data_parallel.P2 (run by `accel launch --nproc_per_node 2`): accel::fp8 under data_parallel<gloo> against one
// process training the same model on the whole batch with the same recipe, for tensorwise and delayed scaling.
// Each process checks, and exits non-zero on a failure:
// - the parameters after 8 SGD steps match the one-process run's within 5e-4 (tensorwise scales each process's
//   input by its own amax, so the float8 roundings differ a little; the gradients are averaged as under bf16);
// - delayed scaling: every process holds the same amax histories and scales (the amaxes are max-reduced at each
//   step), and after the first step the input and weight scales equal the one-process run's bit for bit (the max of
//   the processes' amaxes is the whole batch's).
//
// fp8.fsdp_float8_all_gather.P2 (the argument `fsdp_float8_all_gather`): fp8<> under fully_sharded<gloo> with
// options.fp8.enable_fsdp_float8_all_gather against the same run without it, for a model without shard units and one
// whose blocks are units (gathered around their forward and again around their backward). Each process checks:
// - the converted weights' float8 data and scales as gathered equal, bit for bit, what one process computes casting
//   the full weight (the max of the slices' amaxes is the whole weight's), and the weight parameter holds them
//   divided by the scale; after the step they are released;
// - the outputs at every step and the parameters after 6 SGD steps equal the run without the option bit for bit
//   (stated tolerance: none; the same float8 bytes enter the same matmuls);
// - the bytes all-gathered per step are exactly those of the float32 gather less 3 per element of each converted
//   weight (1 with bfloat16 masters, a third run), plus its 4-byte amax all-reduced, per gather; it prints the ratio
//   (docs/performance.md).
#include "accel_headers.hpp"
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "fp8_tower.hpp"

namespace programs::fp8_data_parallel {

#if ACCEL_HAS_FLOAT8
namespace {

using accel_test::tower;

int failures = 0;
void expect(bool condition, const std::string& what) {
  if (!condition) {
    std::cerr << "FAILED: " << what << "\n";
    ++failures;
  }
}

template <class Recipe>
void compare(const char* recipe) {
  const accel::options options{.cpu = true, .fp8 = {.amax_history_len = 4}};
  accel::accelerator<accel::fp8<Recipe>, accel::data_parallel<accel::gloo>> acc(options);
  accel::accelerator<accel::fp8<Recipe>> whole(options);
  const int P = acc.num_processes(), r = acc.process_index(), B = 32;
  torch::manual_seed(3);
  tower net, baseline;
  for (std::size_t i = 0; i < net->parameters().size(); ++i)
    baseline->parameters()[i].detach().copy_(net->parameters()[i]);
  torch::optim::SGD sgd(net->parameters(), 0.05), baseline_sgd(baseline->parameters(), 0.05);
  auto [model, opt] = acc.prepare(net, sgd);
  auto [baseline_model, baseline_opt] = whole.prepare(baseline, baseline_sgd);
  for (int step = 0; step < 8; ++step) {
    torch::manual_seed(100 + step);  // the same global batch on every process
    const auto x = torch::randn({B * P, 16}), y = torch::randn({B * P, 4});
    acc.backward(torch::mse_loss(model(x.narrow(0, r * B, B)), y.narrow(0, r * B, B)));
    opt.step();
    opt.zero_grad();
    whole.backward(torch::mse_loss(baseline_model(x), y));
    baseline_opt.step();
    baseline_opt.zero_grad();
    if constexpr (std::is_same_v<Recipe, accel::delayed_scaling>) {
      const auto& mine = acc.precision().scaling_state();
      const auto everyone = acc.gather(mine.scales().unsqueeze(0));
      expect(torch::equal(everyone[0], everyone[P - 1]), std::string(recipe) + ": every process has the same scales");
      if (step == 0)
        for (int column : {0, 1, 3, 4})  // a's and b's input and weight
          expect(torch::equal(mine.scales()[column], whole.precision().scaling_state().scales()[column]),
                 std::string(recipe) + ": after the first step, scale " + std::to_string(column) +
                     " is the whole batch's");
    }
  }
  double largest = 0;
  for (std::size_t i = 0; i < net->parameters().size(); ++i)
    largest = std::max(largest, (net->parameters()[i] - baseline->parameters()[i]).abs().max().item<double>());
  std::cout << "process " << r << ", " << recipe << ": largest parameter difference from one process " << largest
            << "\n";
  expect(largest < 5e-4, std::string(recipe) + ": the parameters match one process with the whole batch within 5e-4");
}

/// A model whose middle holds most of the weights: a first and a last Linear (left in bfloat16 by fp8's default
/// filter) around blocks of two converted Linears, each block a shard unit with `Units`.
struct block_impl : torch::nn::Module {
  block_impl()
      : up(register_module("up", torch::nn::Linear(64, 256))),
        down(register_module("down", torch::nn::Linear(256, 64))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + down(torch::gelu(up(x))); }
  torch::nn::Linear up, down;
};
TORCH_MODULE_IMPL(block, block_impl);

template <bool Units>
struct stack_impl : torch::nn::Module {
  using block_type = std::conditional_t<Units, accel::shard_unit<block>, block>;
  stack_impl() : first(register_module("first", torch::nn::Linear(16, 64))) {
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("block" + std::to_string(i), block_type(block())));
    last = register_module("last", torch::nn::Linear(64, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = first(x);
    for (auto& b : blocks) h = b(h);
    return last(h);
  }
  torch::nn::Linear first{nullptr}, last{nullptr};
  std::vector<block_type> blocks;
};

/// `w` cast as fp8<> casts a whole weight: torchao's tensorwise scale from its amax, e4m3.
std::pair<at::Tensor, at::Tensor> whole_weight_cast(const at::Tensor& w) {
  const auto cast = accel::detail::fp8::cast_dynamic(w, at::kFloat8_e4m3fn, std::nullopt, false);
  return {cast.data, cast.scale};
}

/// Elements of the converted weights, padded to P chunks (what their all-gathers deliver).
template <class Model>
std::int64_t converted_elements(Model& net, int P) {
  std::int64_t elements = 0;
  for (auto& unit : net->blocks) {
    const auto& b = [&]() -> const block& {
      if constexpr (requires { unit->module(); })
        return unit->module();
      else
        return unit;
    }();
    for (const auto* linear : {&b->up, &b->down}) {  // from the options: at rest the weight is this process's slice
      const auto n = (*linear)->options.in_features() * (*linear)->options.out_features();
      elements += (n + P - 1) / P * P;
    }
  }
  return elements;
}

/// Each block's weights as `precision` holds them gathered (in float8, with the scale), against casting the whole
/// weight as the run without the float8 gather holds it (`reference`), and what the gathered parameter holds.
template <class Precision, class Blocks>
void check_gathered_weights(const Precision& precision, Blocks& blocks, Blocks& reference, const std::string& name) {
  for (std::size_t i = 0; i < blocks.size(); ++i)
    for (const char* linear : {"up", "down"}) {
      const auto layer = "block" + std::to_string(i) + "." + linear;
      const auto gathered = precision.gathered_weight(layer);
      const auto weight_on = blocks[i]->named_parameters()[std::string(linear) + ".weight"];
      const auto weight_off = reference[i]->named_parameters()[std::string(linear) + ".weight"];
      const auto [data, scale] = whole_weight_cast(weight_off);
      expect(gathered.has_value(), name + layer + " holds its weight gathered in float8");
      if (!gathered) continue;
      expect(gathered->first.scalar_type() == at::kFloat8_e4m3fn && gathered->first.sizes() == weight_off.sizes(),
             name + layer + "'s gathered weight is e4m3 of the weight's shape");
      expect(torch::equal(gathered->first.view(at::kByte), data.view(at::kByte)),
             name + layer + "'s gathered float8 bytes are those of casting the whole weight");
      expect(torch::equal(gathered->second, scale), name + layer + "'s scale is the whole weight's");
      expect(torch::equal(weight_on, (data.to(at::kFloat) / scale).to(weight_on.scalar_type())),
             name + layer + "'s float32 weight holds the float8 values divided by the scale meanwhile");
    }
}

/// After a forward (without units the weights stay gathered in float8 until the step), what checkpoints read is
/// the float32 masters: `get_state_dict` and `save_state` gather them again in full; the next forward
/// computes as before.
template <class Accelerator, class Model>
void check_full_after_forward(Accelerator& on, Accelerator& off, Model& model_on, Model& model_off,
                              const std::string& name) {
  torch::manual_seed(300);
  const auto x = torch::randn({4, 16});
  (void)model_on(x);
  (void)model_off(x);
  const auto state_on = on.get_state_dict(model_on), state_off = off.get_state_dict(model_off);
  for (std::size_t i = 0; i < state_on.size(); ++i)
    expect(torch::equal(state_on[i].second, state_off[i].second),
           name + "get_state_dict after a forward gives the float32 " + state_on[i].first);
  // save_state gathers the parameters in full around its writes (with_full_parameters): the same model file.
  const char* port = std::getenv("MASTER_PORT");
  const auto directory =
      std::filesystem::temp_directory_path() / ("accel_fp8_gather_" + std::string(port ? port : "0"));
  on.save_state(directory / "on");
  off.save_state(directory / "off");
  if (on.is_main_process()) {
    const auto read = [](const std::filesystem::path& file) {
      std::ifstream in(file, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const auto saved_on = read(directory / "on" / "model.safetensors");
    expect(!saved_on.empty() && saved_on == read(directory / "off" / "model.safetensors"),
           name + "save_state after a forward writes the float32 weights");
  }
  on.wait_for_everyone();
  if (on.is_main_process()) accel::detail::remove_tree(directory);  // not remove_all: lint.directory_iterators
  expect(torch::equal(model_on(x), model_off(x)), name + "a forward after save_state computes the same");
}

template <bool Units>
void compare_gathers(const char* variant, at::ScalarType masters = at::kFloat) {
  using model = torch::nn::ModuleHolder<stack_impl<Units>>;
  const accel::options off_options{.cpu = true},
      on_options{.cpu = true, .fp8 = {.enable_fsdp_float8_all_gather = true}};
  accel::accelerator<accel::fp8<>, accel::fully_sharded<accel::gloo>> off(off_options), on(on_options);
  const int P = on.num_processes(), r = on.process_index(), B = 16, steps = 6;
  torch::manual_seed(5);
  model net_off, net_on;
  net_off->to(masters);
  net_on->to(masters);
  for (std::size_t i = 0; i < net_on->parameters().size(); ++i)
    net_on->parameters()[i].detach().copy_(net_off->parameters()[i]);
  torch::optim::SGD sgd_off(net_off->parameters(), 0.05), sgd_on(net_on->parameters(), 0.05);
  auto [model_off, opt_off] = off.prepare(net_off, sgd_off);
  auto [model_on, opt_on] = on.prepare(net_on, sgd_on);
  const auto layers = on.precision().converted_layers();
  expect(layers.size() == 6, std::string(variant) + ": the blocks' six Linears are converted");
  const std::string name = std::string(variant) + ": ";
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(200 + step);
    const auto x = torch::randn({B * P, 16}).narrow(0, r * B, B), y = torch::randn({B * P, 4}).narrow(0, r * B, B);
    const auto out_off = model_off(x), out_on = model_on(x);
    expect(torch::equal(out_off, out_on), name + "step " + std::to_string(step) + "'s outputs are the same");
    if constexpr (!Units)  // the blocks' weights stay gathered from the forward to the step
      check_gathered_weights(on.precision(), net_on->blocks, net_off->blocks, name);
    on.backward(torch::mse_loss(out_on, y));
    off.backward(torch::mse_loss(out_off, y));
    opt_on.step();
    opt_off.step();
    opt_on.zero_grad();
    opt_off.zero_grad();
    for (const auto& layer : layers)
      expect(!on.precision().gathered_weight(layer), name + layer + "'s gathered weight is released after the step");
  }
  double largest = 0;
  for (std::size_t i = 0; i < net_on->parameters().size(); ++i)
    largest =
        std::max(largest, (net_on->parameters()[i] - net_off->parameters()[i]).abs().max().template item<double>());
  expect(largest == 0, name + "the parameters equal the run without the float8 all-gather bit for bit");
  const auto bytes_on = on.parallel().shards_of(sgd_on)->all_gathered_bytes() / steps;
  const auto bytes_off = off.parallel().shards_of(sgd_off)->all_gathered_bytes() / steps;
  const std::uint64_t gathers = Units ? 2 : 1;  // units: around their forward and again around their backward
  const auto converted = static_cast<std::uint64_t>(converted_elements(net_on, P));
  const std::uint64_t saved = c10::elementSize(masters) - 1;  // float32: 3 bytes per element, bfloat16: 1
  expect(bytes_on == bytes_off - saved * converted * gathers + 4 * 6 * gathers,
         name + "the float8 gather saves all but 1 byte per converted element and adds a 4-byte amax per weight");
  std::cout << "process " << r << ", " << variant << ": all-gathered per step " << bytes_on
            << " bytes with the float8 all-gather, " << bytes_off << " without (ratio "
            << static_cast<double>(bytes_on) / static_cast<double>(bytes_off) << "; converted weights " << converted
            << " of " << bytes_off / gathers / c10::elementSize(masters) << " elements per gather)\n";
  check_full_after_forward(on, off, model_on, model_off, name);
}

}  // namespace
#endif

int run(int argc, char** argv) {
#if !ACCEL_HAS_FLOAT8
  std::cerr << "fp8_data_parallel: this LibTorch has no float8 (accel::fp8 needs 2.4 or newer)\n";
  return 77;
#else
  if (argc > 1 && std::strcmp(argv[1], "fsdp_float8_all_gather") == 0) {
    compare_gathers<false>("without units");
    compare_gathers<true>("with shard units");
    compare_gathers<false>("bfloat16 masters, without units", at::kBFloat16);
  } else {
    compare<accel::tensorwise_scaling>("tensorwise");
    compare<accel::delayed_scaling>("delayed");
  }
  return failures == 0 ? 0 : 1;
#endif
}

}  // namespace programs::fp8_data_parallel
