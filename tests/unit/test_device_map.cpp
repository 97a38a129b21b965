// accel::infer_auto_device_map and get_balanced_memory (accel/device_map.hpp) on a small language model described by
// hand: the expected maps are what Accelerate 1.15 gives on the same torch.nn model (check_device_map.py's TinyLM(
// vocab=10, width=4, layers=6)); bigmodel.device_map.accelerate compares thousands more with Accelerate itself.
#include <accel/device_map.hpp>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

// A program's own helpers named as accel's: called unqualified with accel's module_tree, they must be the ones
// chosen, not ambiguous with accel's through argument-dependent lookup. This file would not compile if they were.
namespace port {
std::int64_t compute_module_sizes(const accel::module_tree& model) {
  return static_cast<std::int64_t>(model.children.size());
}
std::int64_t infer_auto_device_map(const accel::module_tree& model, const accel::device_map_options&) {
  return static_cast<std::int64_t>(model.children.size());
}
std::int64_t children_twice(const accel::module_tree& model) {
  return compute_module_sizes(model) + infer_auto_device_map(model, {});
}
}  // namespace port

namespace {

using accel::map_device;

accel::module_tree linear(const std::string& name, int in, int out, bool bias = true) {
  accel::module_tree layer{
      .name = name, .class_name = "Linear", .parameters = {{.name = "weight", .elements = in * out}}};
  if (bias) layer.parameters.push_back({.name = "bias", .elements = out});
  return layer;
}

accel::module_tree layer_norm(const std::string& name, int width) {
  return {.name = name,
          .class_name = "LayerNorm",
          .parameters = {{.name = "weight", .elements = width}, {.name = "bias", .elements = width}}};
}

/// check_device_map.py's TinyLM: an embedding, `layers` blocks (attention, a 2-layer MLP, a norm: 416 bytes each),
/// a norm and a head whose weight is the embedding's (tied). 2688 bytes in all.
accel::module_tree tiny_lm(int layers = 6) {
  accel::module_tree blocks{.name = "blocks", .class_name = "ModuleList"};
  for (int i = 0; i < layers; ++i) {
    accel::module_tree mlp{.name = "mlp",
                           .class_name = "Sequential",
                           .children = {linear("0", 4, 8), {.name = "1", .class_name = "GELU"}, linear("2", 8, 4)}};
    blocks.children.push_back({.name = std::to_string(i),
                               .class_name = "Block",
                               .children = {linear("attn", 4, 4), mlp, layer_norm("norm", 4)}});
  }
  accel::module_tree head = linear("head", 4, 10, false);
  head.parameters[0].tied_to = "embed.weight";
  return {.class_name = "TinyLM",
          .children = {{.name = "embed", .class_name = "Embedding", .parameters = {{.name = "weight", .elements = 40}}},
                       blocks,
                       layer_norm("norm", 4),
                       head}};
}

std::map<std::string, std::string> plan(const accel::device_map_options& options,
                                        const accel::module_tree& model = tiny_lm()) {
  std::map<std::string, std::string> map;
  for (const auto& [name, device] : accel::infer_auto_device_map(model, options)) map[name] = device.str();
  return map;
}

std::string refusal(const accel::device_map_options& options, const accel::module_tree& model = tiny_lm()) {
  try {
    (void)accel::infer_auto_device_map(model, options);
  } catch (const accel::device_map_error& e) {
    return e.what();
  }
  return "accepted";
}

const accel::memory_limits three_gpus{
    {map_device::gpu(0), 3000}, {map_device::gpu(1), 3000}, {map_device::gpu(2), 3000}};

}  // namespace

TEST_CASE("sequential fills GPUs in order, then the CPU, keeping room for the largest layer", "[device_map]") {
  const accel::memory_limits limits{{map_device::gpu(0), 1500}, {map_device::gpu(1), 1500}, {map_device::cpu(), 3000}};
  CHECK(plan({.max_memory = limits, .no_split_module_classes = {"Block"}}) ==
        std::map<std::string, std::string>{{"embed", "0"},
                                           {"head", "0"},
                                           {"blocks.0", "0"},
                                           {"blocks.1", "0"},
                                           {"blocks.2", "1"},
                                           {"blocks.3", "1"},
                                           {"blocks.4", "1"},
                                           {"blocks.5", "cpu"},
                                           {"norm", "cpu"}});
}

TEST_CASE("a module that does not fit is split into its children unless its class is no-split", "[device_map]") {
  const accel::memory_limits limits{{map_device::gpu(0), 1000}, {map_device::gpu(1), 600}, {map_device::cpu(), 1200}};
  CHECK(plan({.max_memory = limits}) == std::map<std::string, std::string>{{"embed", "0"},
                                                                           {"head", "0"},
                                                                           {"blocks.0", "0"},
                                                                           {"blocks.1.attn", "0"},
                                                                           {"blocks.1.mlp.0", "0"},
                                                                           {"blocks.1.mlp.1", "0"},
                                                                           {"blocks.1.mlp.2", "1"},
                                                                           {"blocks.1.norm", "1"},
                                                                           {"blocks.2", "1"},
                                                                           {"blocks.3", "cpu"},
                                                                           {"blocks.4", "cpu"},
                                                                           {"blocks.5.attn", "cpu"},
                                                                           {"blocks.5.mlp", "disk"},
                                                                           {"blocks.5.norm", "disk"},
                                                                           {"norm", "disk"}});
  CHECK(plan({.max_memory = limits, .no_split_module_classes = {"Block"}}) ==
        std::map<std::string, std::string>{{"embed", "0"},
                                           {"head", "0"},
                                           {"blocks.0", "0"},
                                           {"blocks.1", "1"},
                                           {"blocks.2", "cpu"},
                                           {"blocks.3", "disk"},
                                           {"blocks.4", "disk"},
                                           {"blocks.5", "disk"},
                                           {"norm", "disk"}});
  // Loaded as float16, every floating tensor counts 2 bytes.
  CHECK(plan({.max_memory = limits, .no_split_module_classes = {"Block"}, .dtype_size = 2}) ==
        std::map<std::string, std::string>{{"embed", "0"},
                                           {"head", "0"},
                                           {"blocks.0", "0"},
                                           {"blocks.1", "0"},
                                           {"blocks.2", "0"},
                                           {"blocks.3", "1"},
                                           {"blocks.4", "1"},
                                           {"blocks.5", "cpu"},
                                           {"norm", "cpu"}});
}

TEST_CASE("tied parameters go to one device with the module that holds them first", "[device_map]") {
  const accel::memory_limits small_gpu{{map_device::gpu(0), 300}, {map_device::cpu(), 1000}};
  const auto map = plan({.max_memory = small_gpu, .no_split_module_classes = {"Block"}});
  CHECK(map.at("embed") == "cpu");
  CHECK(map.at("head") == map.at("embed"));
  CHECK(map == std::map<std::string, std::string>{{"embed", "cpu"},
                                                  {"head", "cpu"},
                                                  {"blocks.0", "cpu"},
                                                  {"blocks.1", "disk"},
                                                  {"blocks.2", "disk"},
                                                  {"blocks.3", "disk"},
                                                  {"blocks.4", "disk"},
                                                  {"blocks.5", "disk"},
                                                  {"norm", "disk"}});
}

TEST_CASE("balanced spreads the model over the GPUs, balanced_low_0 keeps GPU 0 free, auto is balanced",
          "[device_map]") {
  const accel::memory_limits two_gpus{
      {map_device::gpu(0), 3000}, {map_device::gpu(1), 3000}, {map_device::cpu(), 3000}};
  // Even share 2688 / 2 plus 1.25 x the Block's 416 bytes, on every GPU but the last.
  CHECK(accel::get_balanced_memory(tiny_lm(), two_gpus, {"Block"}) ==
        accel::memory_limits{{map_device::gpu(0), 1864}, {map_device::gpu(1), 3000}, {map_device::cpu(), 3000}});
  const std::map<std::string, std::string> balanced{{"embed", "0"},    {"head", "0"},     {"blocks.0", "0"},
                                                    {"blocks.1", "0"}, {"blocks.2", "0"}, {"blocks.3", "1"},
                                                    {"blocks.4", "1"}, {"blocks.5", "1"}, {"norm", "1"}};
  for (const auto strategy : {accel::device_map_strategy::balanced, accel::device_map_strategy::automatic})
    CHECK(plan({.max_memory = two_gpus, .no_split_module_classes = {"Block"}, .strategy = strategy}) == balanced);
  // Sequential: the whole model fits on GPU 0.
  CHECK(plan({.max_memory = two_gpus, .no_split_module_classes = {"Block"}}) ==
        std::map<std::string, std::string>{{"", "0"}});

  CHECK(accel::get_balanced_memory(tiny_lm(), three_gpus, {"Block"}, true) ==
        accel::memory_limits{{map_device::gpu(0), 0}, {map_device::gpu(1), 1864}, {map_device::gpu(2), 3000}});
  CHECK(plan({.max_memory = three_gpus,
              .no_split_module_classes = {"Block"},
              .strategy = accel::device_map_strategy::balanced_low_0}) ==
        std::map<std::string, std::string>{{"embed", "1"},
                                           {"head", "1"},
                                           {"blocks.0", "1"},
                                           {"blocks.1", "1"},
                                           {"blocks.2", "1"},
                                           {"blocks.3", "1"},
                                           {"blocks.4", "2"},
                                           {"blocks.5", "2"},
                                           {"norm", "2"}});
  // Without no-split classes the margin is 1.25 x the mean innermost module (the Linear and norm layers).
  CHECK(accel::get_balanced_memory(tiny_lm(), three_gpus, {}) ==
        accel::memory_limits{{map_device::gpu(0), 1024}, {map_device::gpu(1), 1024}, {map_device::gpu(2), 3000}});
}

TEST_CASE("a plan that needs disk is refused when offloading to disk is not allowed, naming the module and the fix",
          "[device_map]") {
  // GPU 0 holds the embedding and block 0; block 1 (416 bytes) is larger than GPU 1 and the CPU.
  const accel::memory_limits limits{{map_device::gpu(0), 1000}, {map_device::gpu(1), 300}, {map_device::cpu(), 300}};
  CHECK(refusal({.max_memory = limits, .no_split_module_classes = {"Block"}, .offload_to_disk = false}) ==
        "accel: device map: module blocks.1 (Block) of 416 bytes fits on no device left in max_memory and "
        "offload_to_disk is false (GPU 0 and the CPU keep room for the largest layer left, 416 bytes, beside what they "
        "hold); raise max_memory so that a device has 416 bytes free (GPU 0 or the CPU: 832), take Block out of "
        "no_split_module_classes so that it can be split, or set offload_to_disk");
  const auto offloaded = plan({.max_memory = limits, .no_split_module_classes = {"Block"}});
  CHECK(offloaded.at("blocks.0") == "0");
  CHECK(offloaded.at("blocks.1") == "disk");
  // Where every device is smaller than the largest layer, the room kept for it sends the first module to disk.
  CHECK(refusal({.max_memory = {{map_device::gpu(0), 300}, {map_device::cpu(), 300}},
                 .no_split_module_classes = {"Block"},
                 .offload_to_disk = false})
            .starts_with("accel: device map: module embed (Embedding) of 160 bytes fits on no device left"));
  CHECK(refusal({.max_memory = {{map_device::gpu(0), 10000}}, .offload_to_disk = false}) == "accepted");
}

TEST_CASE("bad limits and ties are refused with the fix", "[device_map]") {
  CHECK(refusal({.max_memory = {{map_device::cpu(), -1}}}) ==
        "accel: device map: max_memory of cpu is -1 bytes; give 0 or more (0: the device holds nothing)");
  CHECK(refusal({.max_memory = {{map_device::gpu(-1), 10}}}) ==
        "accel: device map: GPU -1 in max_memory; GPU indices start at 0");
  auto model = tiny_lm();
  model.children.back().parameters[0].tied_to = "embedding.weight";
  CHECK(refusal({.max_memory = {{map_device::cpu(), 10}}}, model) ==
        "accel: device map: parameter head.weight is tied to embedding.weight, which the model does not have before "
        "it; name the first parameter of the tie");
  CHECK_THROWS_WITH(accel::get_balanced_memory(tiny_lm(), {{map_device::gpu(1), 9}, {map_device::gpu(2), 9}}, {}, true),
                    Catch::Contains("has no GPU 0; give GPU 0 a limit (0 keeps it empty), or use balanced"));
  // A class that no module has would split nothing apart: a typo, or a name other than Module::name() gives.
  CHECK(refusal({.max_memory = {{map_device::cpu(), 10000}}, .no_split_module_classes = {"Blokc"}}) ==
        "accel: device map: no_split_module_classes names \"Blokc\", the class of no module of the model, so it would "
        "split nothing apart; its classes are TinyLM, Embedding, ModuleList, Block, Linear, Sequential, GELU, "
        "LayerNorm (a module's Module::name(); an accel::shard_unit's is its wrapped module's)");
  CHECK_THROWS_WITH(accel::get_balanced_memory(tiny_lm(), three_gpus, {"Blokc"}), Catch::Contains("\"Blokc\""));
}

TEST_CASE("balanced_low_0 with GPU 0 given nothing keeps it at 0 and plans on the others, as Accelerate",
          "[device_map]") {
  // Accelerate 1.15: the GPUs with memory are 1 and 2 (n = 2), so each but the last gets 2688 / (n - 1) + 520, and
  // GPU 0 keeps min(2688 - GPUs 1 to n - 1, 0) = 0.
  const accel::memory_limits zero_first{
      {map_device::gpu(0), 0}, {map_device::gpu(1), 3000}, {map_device::gpu(2), 3000}, {map_device::gpu(3), 3000}};
  CHECK(
      accel::get_balanced_memory(tiny_lm(), zero_first, {"Block"}, true) ==
      accel::memory_limits{
          {map_device::gpu(0), 0}, {map_device::gpu(1), 1864}, {map_device::gpu(2), 1864}, {map_device::gpu(3), 3000}});
  const auto map = plan({.max_memory = zero_first,
                         .no_split_module_classes = {"Block"},
                         .strategy = accel::device_map_strategy::balanced_low_0});
  for (const auto& [name, device] : map) CHECK(device != "0");
  CHECK(map.at("embed") == "1");
}

TEST_CASE("a buffer registered in several modules counts once, a module registered under several names is one entry",
          "[device_map]") {
  // A rotary table (64 float32: 256 bytes) registered in every block counts once, at its first name (Accelerate's
  // named_buffers): the model is 2688 + 256 bytes, not 2688 + 6 x 256.
  auto rotary = tiny_lm();
  for (std::size_t i = 0; i < 6; ++i)
    rotary.children[1].children[i].buffers.push_back(
        {.name = "inv_freq", .elements = 64, .tied_to = i == 0 ? "" : "blocks.0.inv_freq"});
  const auto sizes = accel::compute_module_sizes(rotary);
  CHECK(sizes.total() == 2688 + 256);
  CHECK(sizes.of("blocks.0") == 416 + 256);
  CHECK(sizes.of("blocks.1") == 416);
  CHECK_FALSE(sizes.contains("blocks.1.inv_freq"));
  // ALBERT-style: one Block registered four times in a ModuleList is listed once (Accelerate's named_children), its
  // tensors counted at their first names; its other names are no entries of the map.
  accel::module_tree shared{.class_name = "Shared"};
  auto block = tiny_lm(1).children[1].children[0];
  shared.children.push_back({.name = "layers", .class_name = "ModuleList"});
  for (int i = 0; i < 4; ++i) {
    auto again = block;
    again.name = std::to_string(i);
    if (i > 0) again.shared_with = "layers.0";
    shared.children[0].children.push_back(again);
  }
  for (int i = 1; i < 4; ++i) {  // the repeats' tensors are the first's: tied to their names under layers.0
    auto& again = shared.children[0].children[static_cast<std::size_t>(i)];
    for (auto& p : again.children[0].parameters) p.tied_to = "layers.0.attn." + p.name;
    for (auto& layer : again.children[1].children)
      for (auto& p : layer.parameters) p.tied_to = "layers.0.mlp." + layer.name + "." + p.name;
    for (auto& p : again.children[2].parameters) p.tied_to = "layers.0.norm." + p.name;
  }
  CHECK(accel::compute_module_sizes(shared).total() == 416);
  CHECK(plan({.max_memory = {{map_device::gpu(0), 300}, {map_device::cpu(), 10000}}}, shared) ==
        std::map<std::string, std::string>{{"layers.0.attn", "0"}, {"layers.0.mlp", "cpu"}, {"layers.0.norm", "cpu"}});
}

TEST_CASE("compute_module_sizes and get_max_layer_size are Accelerate's, the sizes the plans use", "[device_map]") {
  const auto sizes = accel::compute_module_sizes(tiny_lm());
  CHECK(sizes.total() == 2688);
  CHECK(sizes.of("blocks.0") == 416);
  CHECK(sizes.of("blocks.0.mlp.1") == 0);  // a GELU: nothing of its own, as Accelerate's defaultdict
  CHECK(sizes.entries().front() == std::pair<std::string, std::int64_t>{"", 2688});
  CHECK(sizes.entries()[1] == std::pair<std::string, std::int64_t>{"embed", 160});
  CHECK(accel::compute_module_sizes(tiny_lm(), 2).total() == 2688 / 2);
  const auto largest = accel::get_max_layer_size(tiny_lm(), sizes, {"Block"});
  CHECK(largest.bytes == 416);
  CHECK(largest.names ==
        std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.4", "blocks.5"});
  CHECK(accel::get_max_layer_size(tiny_lm(), sizes, {}).bytes == 160);  // the embedding, split down to layers
}

TEST_CASE("an empty max_memory plans with what the machine has free, as Accelerate's get_max_memory", "[device_map]") {
  const auto limits = accel::get_max_memory();
  REQUIRE(limits.contains(map_device::cpu()));
  // MemAvailable lies between the free pages and all of memory.
  const auto page = ::sysconf(_SC_PAGESIZE);
  CHECK(limits.at(map_device::cpu()) >= ::sysconf(_SC_AVPHYS_PAGES) * page / 2);
  CHECK(limits.at(map_device::cpu()) <= ::sysconf(_SC_PHYS_PAGES) * page);
  CHECK(plan({}) == std::map<std::string, std::string>{{"", limits.contains(map_device::gpu(0)) ? "0" : "cpu"}});
  CHECK(plan({.strategy = accel::device_map_strategy::automatic}).size() >= 1);
}

TEST_CASE("a program's own compute_module_sizes and infer_auto_device_map are its own (accel's are function objects)",
          "[device_map]") {
  CHECK(port::children_twice(tiny_lm()) == 8);
}
