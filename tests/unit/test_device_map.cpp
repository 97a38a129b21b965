// accel::infer_auto_device_map and get_balanced_memory (accel/device_map.hpp) on a small language model described by
// hand: the expected maps are what Accelerate 1.15 gives on the same torch.nn model (check_device_map.py's TinyLM(
// vocab=10, width=4, layers=6)); bigmodel.device_map.accelerate compares thousands more with Accelerate itself.
#include <accel/device_map.hpp>
#include <catch2/catch.hpp>

#include <map>
#include <string>

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
  CHECK(refusal({}) ==
        "accel: device map: max_memory is empty; give the bytes each device may hold, e.g. {{gpu(0), 10 << 30}, "
        "{cpu(), 64 << 30}} (accel does not probe free memory for a plan)");
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
                    Catch::Contains("give GPU 0 a limit, or use balanced"));
}
