// Big-model inference (accel/big_modeling.hpp, issue 33 item 3): init_empty_weights allocates nothing, and a model
// dispatched by a device map (CPU, disk, both; from model.safetensors, from a Hugging Face index, from memory)
// computes the same logits, bit for bit, as the same model held in memory; the refusals name the problem and the fix.
#include "accel_headers.hpp"
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "offload_model.hpp"
#include "support.hpp"

// A program's own helpers named as accel's dispatching functions: called unqualified with accel's types, they must be
// the ones chosen, not ambiguous with accel's through argument-dependent lookup (issue 56: a port broke so with
// key_averages). This file would not compile if accel's were functions.
namespace port {
int dispatch_model(torch::nn::Module&, const accel::device_map& map) { return static_cast<int>(map.size()); }
int disk_offload(torch::nn::Module&, const accel::device_map& map) { return 10 + static_cast<int>(map.size()); }
int dispatch_both(torch::nn::Module& model, const accel::device_map& map) {
  return dispatch_model(model, map) + disk_offload(model, map);
}
}  // namespace port

namespace {

using accel::map_device;
using accel_test::OffloadLM;

constexpr std::int64_t vocab = 50, width = 16, hidden = 32;
constexpr int layers = 4;

OffloadLM reference_model() {
  torch::manual_seed(7);
  OffloadLM model(vocab, width, hidden, layers);
  model->eval();
  return model;
}

OffloadLM empty_model() {
  accel::init_empty_weights empty;
  OffloadLM model(vocab, width, hidden, layers);
  model->eval();
  return model;
}

torch::Tensor tokens() { return torch::arange(0, 24, torch::kLong).remainder(vocab).view({2, 12}); }

torch::Tensor logits(OffloadLM& model) {
  torch::NoGradGuard no_grad;
  return model->forward(tokens());
}

/// The reference model's weights written to `dir`/model.safetensors, and its logits.
torch::Tensor saved_reference(const std::filesystem::path& dir) {
  auto model = reference_model();
  accel::save_model(*model, dir);
  return logits(model);
}

bool all_meta(const torch::nn::Module& module, const std::string& prefix) {
  for (const auto& p : module.named_parameters())
    if (p.key().rfind(prefix, 0) == 0 && !p.value().is_meta()) return false;
  return true;
}

}  // namespace

TEST_CASE("init_empty_weights: a model of 143 MB is built without a byte of storage, shapes and dtypes as built",
          "[bigmodel_offload]") {
  accel::count_cpu_memory();
  const auto before = accel::memory_stats(torch::kCPU);
  accel::detail::installed_cpu_counter().load()->reset_peak();
  OffloadLM big{nullptr};
  {
    accel::init_empty_weights empty;
    big = OffloadLM(1 << 16, 128, 512, 8);  // 17.9 M parameters, 143 MB in float64
    big->to(torch::kDouble);                // a conversion of meta tensors stays on meta
  }
  const auto after = accel::memory_stats(torch::kCPU);
  CHECK(after.allocated == before.allocated);
  CHECK(after.peak_allocated == before.allocated);
  // embedding, head (and its bias), 8 blocks of two Linear layers and a norm
  const std::int64_t parameters =
      65536 * 128 + (128 * 65536 + 65536) + 8 * ((128 * 512 + 512) + (512 * 128 + 128) + 256);
  CHECK(accel_test::parameter_bytes(*big) == parameters * 8);
  for (const auto& p : big->named_parameters()) {
    INFO(p.key());
    CHECK(p.value().is_meta());
    CHECK(p.value().scalar_type() == torch::kDouble);
  }
  CHECK(big->seen.is_meta());  // buffers too (Accelerate's include_buffers=True)

  // The same shapes and dtypes (float32) as a model built normally, and every name.
  const auto empty = empty_model();
  const auto built = reference_model();
  const auto built_parameters = built->named_parameters();
  REQUIRE(empty->named_parameters().size() == built_parameters.size());
  for (const auto& p : empty->named_parameters()) {
    INFO(p.key());
    CHECK(p.value().sizes() == built_parameters[p.key()].sizes());
    CHECK(p.value().scalar_type() == built_parameters[p.key()].scalar_type());
    CHECK(p.value().requires_grad());
  }
  // Only inside the scope, and only on its thread.
  CHECK(torch::ones({2}).device().is_cpu());
  {
    accel::init_empty_weights empty_scope;
    CHECK(torch::zeros({3}, torch::kLong).is_meta());
    CHECK(torch::full({2}, 1.5, torch::TensorOptions().device(torch::kCPU)).is_meta());  // whatever device is asked
    bool other_thread_cpu = false;
    std::thread([&] { other_thread_cpu = torch::ones({2}).device().is_cpu(); }).join();
    CHECK(other_thread_cpu);
    {
      accel::init_empty_weights nested;
    }
    CHECK(torch::empty({1}).is_meta());  // the nested scope's end restores the outer one
  }
  CHECK(torch::empty({1}).device().is_cpu());
}

TEST_CASE("load_checkpoint_and_dispatch on the CPU: the logits of the model in memory, bit for bit",
          "[bigmodel_offload]") {
  const auto dir = accel_test::scratch_directory("offload_cpu");
  const auto expected = saved_reference(dir);
  auto model = empty_model();
  const auto dispatched =
      accel::load_checkpoint_and_dispatch(*model, dir / "model.safetensors", {.map = {{"", map_device::cpu()}}});
  for (const auto& p : model->parameters()) CHECK(p.device().is_cpu());
  CHECK(model->seen.device().is_cpu());
  CHECK(torch::equal(logits(model), expected));
  CHECK(dispatched.disk_bytes_read() == 0);
}

TEST_CASE("disk: every unit reads its weights for its own forward and lets them go, logits bit for bit",
          "[bigmodel_offload]") {
  const auto dir = accel_test::scratch_directory("offload_disk");
  const auto expected = saved_reference(dir);
  auto model = empty_model();
  const auto dispatched =
      accel::load_checkpoint_and_dispatch(*model, dir / "model.safetensors", {.map = {{"", map_device::disk()}}});
  CHECK(all_meta(*model, ""));
  CHECK(torch::equal(logits(model), expected));
  CHECK(all_meta(*model, ""));  // let go after each forward
  CHECK(dispatched.disk_bytes_read() == accel_test::parameter_bytes(*model));
  CHECK(torch::equal(logits(model), expected));
  CHECK(dispatched.disk_bytes_read() == 2 * accel_test::parameter_bytes(*model));
}

TEST_CASE("mixed CPU and disk maps, given and planned, from model.safetensors and from a Hugging Face index",
          "[bigmodel_offload]") {
  const auto dir = accel_test::scratch_directory("offload_mixed");
  const auto expected = saved_reference(dir);
  const accel::device_map map{
      {"embed", map_device::cpu()},        {"blocks.0", map_device::cpu()},      {"blocks.1", map_device::disk()},
      {"blocks.2.up", map_device::disk()}, {"blocks.2.down", map_device::cpu()}, {"blocks.2.norm", map_device::disk()},
      {"blocks.3", map_device::disk()},    {"head", map_device::cpu()},          {"seen", map_device::cpu()}};
  SECTION("model.safetensors, a given map") {
    auto model = empty_model();
    const auto dispatched = accel::load_checkpoint_and_dispatch(*model, dir / "model.safetensors", {.map = map});
    CHECK(model->units[0]->module()->up->weight.device().is_cpu());
    CHECK(all_meta(*model, "blocks.1."));
    CHECK(model->units[2]->module()->up->weight.is_meta());
    CHECK(model->units[2]->module()->down->weight.device().is_cpu());
    CHECK(torch::equal(logits(model), expected));
    CHECK(dispatched.disk_bytes_read() > 0);
  }
  SECTION("a Hugging Face index over files of at most 4 KiB, a map planned under a CPU limit") {
    const auto sharded = dir / "sharded";
    accel::save_model(*reference_model(), sharded, 4096);
    REQUIRE(std::filesystem::exists(sharded / "model.safetensors.index.json"));
    auto model = empty_model();
    const auto unit_class = model->units[0]->name();
    const auto dispatched = accel::load_checkpoint_and_dispatch(
        *model, sharded / "model.safetensors.index.json",
        {.planning = {.max_memory = {{map_device::cpu(), 9000}}, .no_split_module_classes = {unit_class}}});
    std::set<map_device> devices;
    for (const auto& [name, device] : dispatched.map()) devices.insert(device);
    CHECK(devices == std::set<map_device>{map_device::cpu(), map_device::disk()});
    CHECK(torch::equal(logits(model), expected));
  }
}

TEST_CASE("dispatch_model, disk_offload and cpu_offload of a model in memory: bit for bit, weights written once",
          "[bigmodel_offload]") {
  const auto dir = accel_test::scratch_directory("offload_memory");
  auto expected_model = reference_model();
  const auto expected = logits(expected_model);
  SECTION("dispatch_model, an offload folder") {
    auto model = reference_model();
    const auto dispatched = accel::dispatch_model(*model,
                                                  {{"embed", map_device::cpu()},
                                                   {"blocks", map_device::disk()},
                                                   {"head", map_device::cpu()},
                                                   {"seen", map_device::cpu()}},
                                                  {.offload_folder = dir / "offload"});
    CHECK(std::filesystem::exists(dir / "offload" / "offload.safetensors"));
    CHECK(all_meta(*model, "blocks."));
    CHECK(model->head->module()->weight.device().is_cpu());
    CHECK(torch::equal(logits(model), expected));
  }
  SECTION("dispatch_model, the disk weights in a checkpoint (offload_weights): read from there, nothing written") {
    accel::save_model(*reference_model(), dir / "checkpoint");
    auto model = empty_model();  // all on disk, the buffer read from the checkpoint: nothing needs to be in memory
    const auto dispatched =
        accel::dispatch_model(*model, {{"", map_device::disk()}}, {.offload_weights = dir / "checkpoint"});
    CHECK(torch::equal(logits(model), expected));
    CHECK(dispatched.disk_bytes_read() == accel_test::parameter_bytes(*model));
  }
  SECTION("disk_offload") {
    auto model = reference_model();
    const auto dispatched = accel::disk_offload(*model, dir / "disk");
    CHECK(all_meta(*model, ""));
    CHECK(torch::equal(logits(model), expected));
    CHECK(dispatched.disk_bytes_read() == accel_test::parameter_bytes(*model));
  }
  SECTION("cpu_offload on the CPU: the weights stay where they are") {
    auto model = reference_model();
    const auto weight = model->head->module()->weight;
    const auto dispatched = accel::cpu_offload(*model);
    CHECK(model->head->module()->weight.is_same(weight));
    CHECK(torch::equal(logits(model), expected));
  }
  // The GPU's path without a GPU: the meta device stands in for the execution device. Each unit's weights are moved
  // there for its forward and must come back to their own CPU bytes after it (the first GPU run found them left on
  // the GPU: the copy at rest was the parameter itself). The head's unit only (a Linear): LibTorch 2.11 has no meta
  // kernels for the embedding's and the norm's operators.
  SECTION("cpu_offload to another device: each unit's weights there for its forward only, back on their CPU bytes") {
    auto model = reference_model();
    std::vector<std::tuple<torch::Tensor, const void*, torch::Tensor>> at_rest;
    for (const auto& p : model->parameters()) at_rest.emplace_back(p, p.data_ptr(), p.detach().clone());
    const auto dispatched = accel::cpu_offload(*model, torch::kMeta);
    torch::NoGradGuard no_grad;
    CHECK(model->head(torch::ones({2, width}, torch::kMeta)).is_meta());
    for (const auto& [p, bytes, values] : at_rest) {
      CHECK(p.device().is_cpu());
      CHECK(p.data_ptr() == bytes);
      CHECK(torch::equal(p, values));
    }
  }
}

TEST_CASE("no_split_module_classes names a unit by its wrapped module's class, and a class no module has is refused",
          "[bigmodel_offload]") {
  // Each block is accel::shard_unit(OffloadBlock(...)), whose module is named "OffloadBlock": the unit takes that name,
  // so a plan keeps every block whole on one device, as Accelerate's "OffloadBlock" would (the unit's own type name,
  // accel::shard_unit_impl<...>, matched nothing and the blocks were split).
  const auto model = empty_model();
  CHECK(model->units[0]->name() == "OffloadBlock");
  const auto tree = accel::describe_module(*model);
  const accel::device_map_options options{.max_memory = {{map_device::cpu(), 9000}},
                                          .no_split_module_classes = {"OffloadBlock"}};
  const auto map = accel::infer_auto_device_map(tree, options);
  for (const auto& [name, device] : map)
    CHECK((name.rfind("blocks.", 0) != 0 || name.find('.', 7) == std::string::npos));  // a block whole, or none
  CHECK(map != accel::infer_auto_device_map(tree, {.max_memory = options.max_memory}));
  CHECK_THROWS_WITH(
      accel::infer_auto_device_map(tree, {.max_memory = options.max_memory, .no_split_module_classes = {"Block"}}),
      Catch::Contains("no_split_module_classes names \"Block\", the class of no module of the model") &&
          Catch::Contains("OffloadBlock"));
}

TEST_CASE("dispatch refusals name the problem and the fix, before anything changes", "[bigmodel_offload]") {
  using Catch::Matchers::Contains;
  const auto dir = accel_test::scratch_directory("offload_refusals");
  saved_reference(dir);
  SECTION("a disk entry outside every unit") {
    torch::nn::Sequential plain(torch::nn::Linear(4, 4));
    REQUIRE_THROWS_WITH(accel::disk_offload(*plain, dir / "plain"),
                        Contains("0.weight is mapped to disk, but no accel::shard_unit holds it") &&
                            Contains("wrap the module that holds it in a unit"));
    CHECK(plain[0]->as<torch::nn::Linear>()->weight.device().is_cpu());
    CHECK_FALSE(std::filesystem::exists(dir / "plain"));
  }
  SECTION("a map that leaves a tensor out") {
    auto model = empty_model();
    REQUIRE_THROWS_WITH(
        accel::load_checkpoint_and_dispatch(*model, dir, {.map = {{"embed", map_device::cpu()}}}),
        Contains("the device map places nothing of blocks.0.up.weight; map it, or a module holding it"));
  }
  SECTION("a checkpoint of another shape, or with a tensor the model lacks") {
    auto model = empty_model();
    OffloadLM narrow(vocab, width / 2, hidden, layers);
    accel::save_model(*narrow, dir / "narrow");
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(*model, dir / "narrow", {.map = {{"", map_device::cpu()}}}),
                        Contains("holds embed.weight as Float[50, 8], the model as Float[50, 16]"));
    auto tensors = accel::detail::state_of(*reference_model());
    tensors.emplace_back("extra.weight", torch::ones({2}));
    accel::safetensors::save(dir / "extra.safetensors", tensors);
    REQUIRE_THROWS_WITH(
        accel::load_checkpoint_and_dispatch(*model, dir / "extra.safetensors", {.map = {{"", map_device::cpu()}}}),
        Contains("holds extra.weight, which the model does not have"));
    REQUIRE_THROWS_WITH(
        accel::load_checkpoint_and_dispatch(*model, dir / "missing", {.map = {{"", map_device::cpu()}}}),
        Contains("does not exist; give a .safetensors file"));
    CHECK(all_meta(*model, ""));  // nothing was dispatched
  }
  SECTION("weights on the meta device with nothing to load them from; disk without a folder; a GPU not there") {
    auto model = empty_model();
    REQUIRE_THROWS_WITH(accel::dispatch_model(*model, {{"", map_device::cpu()}}),
                        Contains("embed.weight is on the meta device") &&
                            Contains("accel::load_checkpoint_and_dispatch or .offload_weights"));
    auto in_memory = reference_model();
    REQUIRE_THROWS_WITH(accel::dispatch_model(*in_memory, {{"blocks", map_device::disk()}, {"", map_device::cpu()}}),
                        Contains("blocks.0.up.weight is mapped to disk; give .offload_folder"));
    CHECK(in_memory->units[0]->module()->up->weight.device().is_cpu());
    if (!torch::cuda::is_available())
      REQUIRE_THROWS_WITH(accel::dispatch_model(*in_memory, {{"", map_device::gpu(0)}}),
                          Contains("places weights on GPU 0, which this machine does not have"));
    if (!torch::cuda::is_available())  // refused before the CPU entries were moved
      REQUIRE_THROWS(accel::dispatch_model(*in_memory, {{"head", map_device::gpu(0)}, {"", map_device::disk()}},
                                           {.offload_folder = dir / "never"}));
    CHECK_FALSE(std::filesystem::exists(dir / "never"));
    CHECK(in_memory->units[0]->module()->up->weight.device().is_cpu());
  }
}

TEST_CASE("a dropped handle detaches its hooks: the disk-mapped weights are not read in any more",
          "[bigmodel_offload]") {
  const auto dir = accel_test::scratch_directory("offload_dropped");
  saved_reference(dir);
  auto model = empty_model();
  {
    const auto dispatched = accel::load_checkpoint_and_dispatch(*model, dir, {.map = {{"", map_device::disk()}}});
    CHECK_NOTHROW(logits(model));
  }
  CHECK_THROWS(logits(model));
  CHECK(all_meta(*model, ""));
}

namespace {
/// A module holding a unit of its own (wrapped in a unit in turn): units nest.
struct NestedImpl : torch::nn::Module {
  NestedImpl()
      : outer(register_module("outer", torch::nn::Linear(6, 6))),
        inner(register_module("inner", accel::shard_unit(torch::nn::Linear(6, 3)))) {}
  torch::Tensor forward(const torch::Tensor& x) { return inner(torch::relu(outer(x))); }
  torch::nn::Linear outer;
  accel::shard_unit<torch::nn::Linear> inner;
};
TORCH_MODULE(Nested);

/// A head whose weight is the embedding's (tied), in a unit of its own.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const torch::Tensor& tied) : weight(register_parameter("weight", tied)) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(x, weight.t()); }
  torch::Tensor weight;
};
TORCH_MODULE(TiedHead);
}  // namespace

TEST_CASE("nested units each bring in their own tensors, and a tied weight on disk used by another unit is refused",
          "[bigmodel_offload]") {
  const auto dir = accel_test::scratch_directory("offload_nested");
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  accel::shard_unit<Nested> nested(Nested{});
  const auto input = torch::randn({5, 6});
  const auto expected = nested(input);
  const auto dispatched = accel::disk_offload(*nested, dir / "nested");
  CHECK(torch::equal(nested(input), expected));
  CHECK(all_meta(*nested, ""));
  CHECK(dispatched.disk_bytes_read() == (6 * 6 + 6 + 6 * 3 + 3) * 4);

  torch::nn::Sequential tied_model;
  auto embed = accel::shard_unit(torch::nn::Embedding(10, 4));
  tied_model->push_back("embed", embed);
  tied_model->push_back("head", accel::shard_unit(TiedHead(embed->module()->weight)));
  REQUIRE_THROWS_WITH(accel::dispatch_model(*tied_model, {{"embed", map_device::disk()}, {"head", map_device::cpu()}},
                                            {.offload_folder = dir / "tied"}),
                      Catch::Matchers::Contains("head.weight is embed.weight (tied), which is mapped to disk") &&
                          Catch::Matchers::Contains("map embed.weight to \"cpu\", or hold both names in one unit"));
  CHECK(embed->module()->weight.device().is_cpu());
  const auto in_memory = accel::dispatch_model(*tied_model, {{"", map_device::cpu()}});
  CHECK(embed->module()->weight.is_same(tied_model->named_parameters()["head.weight"]));
}

// Where CUDA is present (scripts/gpu.sh runs every bigmodel.* test there): GPU entries on GPU 0, a CPU entry and disk
// entries brought to GPU 0 for their forward; cpu_offload and disk_offload to GPU 0. The reference is the same model
// moved whole to GPU 0 (the same kernels: bit for bit). Without CUDA it says so and checks nothing.
TEST_CASE("GPU placement: GPU, CPU and disk entries run on GPU 0, bit for bit with the model on GPU 0",
          "[bigmodel_offload]") {
  if (!torch::cuda::is_available()) {
    WARN("no CUDA here: the GPU placement is not tried");
    return;
  }
  const torch::Device gpu(torch::kCUDA, 0);
  const auto dir = accel_test::scratch_directory("offload_gpu");
  torch::NoGradGuard no_grad;
  auto whole = reference_model();
  accel::save_model(*whole, dir);
  whole->to(gpu);
  const auto expected = whole->forward(tokens().to(gpu));
  SECTION("a map over GPU 0, the CPU and disk") {
    auto model = empty_model();
    const auto dispatched = accel::load_checkpoint_and_dispatch(*model, dir,
                                                                {.map = {{"embed", map_device::gpu(0)},
                                                                         {"blocks.0", map_device::gpu(0)},
                                                                         {"blocks.1", map_device::cpu()},
                                                                         {"blocks.2", map_device::disk()},
                                                                         {"blocks.3", map_device::disk()},
                                                                         {"head", map_device::gpu(0)},
                                                                         {"seen", map_device::gpu(0)}}});
    CHECK(torch::equal(model->forward(tokens().to(gpu)), expected));
    CHECK(model->units[0]->module()->up->weight.device() == gpu);
    CHECK(model->units[1]->module()->up->weight.device().is_cpu());  // back at rest after its forward
    CHECK(model->units[2]->module()->up->weight.is_meta());
  }
  SECTION("cpu_offload and disk_offload to GPU 0") {
    auto on_cpu = reference_model();
    const auto offloaded = accel::cpu_offload(*on_cpu, gpu);
    CHECK(torch::equal(on_cpu->forward(tokens().to(gpu)), expected));
    CHECK(on_cpu->head->module()->weight.device().is_cpu());
    auto on_disk = reference_model();
    const auto from_disk = accel::disk_offload(*on_disk, dir / "disk", gpu);
    CHECK(torch::equal(on_disk->forward(tokens().to(gpu)), expected));
  }
}

TEST_CASE(
    "a program's own dispatch_model(model, map) is its own: accel's dispatching functions are not found by "
    "argument-dependent lookup",
    "[big_modeling]") {
  torch::nn::Linear layer(2, 2);
  const accel::device_map map{{"", accel::map_device::cpu()}};
  CHECK(port::dispatch_both(*layer, map) == 12);
}
