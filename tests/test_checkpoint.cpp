// Model weights in safetensors: round trips of every dtype, sharding with an index, validation of what is read
// (truncated, corrupt, mismatching files leave the model unchanged). The Python side (numpy reads accel's file,
// accel reads Python's) is tests/checkpoint/interop.cmake.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "support.hpp"

namespace {

std::filesystem::path scratch(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("accel_checkpoint_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("safetensors round trip: every dtype, any layout, exact bytes", "[checkpoint]") {
  const auto dir = scratch("dtypes");
  accel::safetensors::tensor_list tensors = {
      {"f64", torch::randn({3, 2}, torch::kDouble)},
      {"f32.transposed", torch::randn({4, 3}).t()},
      {"f16", torch::randn({5}).to(torch::kHalf)},
      {"bf16", torch::randn({2, 2}).to(torch::kBFloat16)},
      {"i64", torch::arange(6).reshape({2, 3})},
      {"i32", torch::arange(4, torch::kInt)},
      {"i8", torch::tensor({-3, 4}, torch::kChar)},
      {"u8", torch::tensor({250, 1}, torch::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::scalar_tensor(7.5)},
      {"empty", torch::zeros({0, 3})},
      {"name with \"quotes\"", torch::ones({1})}};
  accel::safetensors::save(dir / "t.safetensors", tensors, {{"format", "pt"}, {"note", "accel"}});
  std::map<std::string, std::string> metadata;
  auto loaded = accel::safetensors::load(dir / "t.safetensors", &metadata);
  REQUIRE(loaded.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CHECK(loaded[i].first == tensors[i].first);
    CHECK(loaded[i].second.scalar_type() == tensors[i].second.scalar_type());
    CHECK(torch::equal(loaded[i].second, tensors[i].second));
  }
  CHECK(metadata.at("note") == "accel");
  CHECK_FALSE(std::filesystem::exists(dir / "t.safetensors.tmp"));  // written to a temporary, then renamed
  std::filesystem::remove_all(dir);
}

TEST_CASE("safetensors: truncated and corrupt files are named with the problem", "[checkpoint]") {
  const auto dir = scratch("corrupt");
  accel::safetensors::save(dir / "good.safetensors", {{"w", torch::randn({16})}});
  std::ifstream in(dir / "good.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir / name, std::ios::binary) << content;
    return dir / name;
  };
  using Catch::Contains;
  CHECK_THROWS_WITH(accel::safetensors::load(write("short.safetensors", bytes.substr(0, bytes.size() - 4))),
                    Contains("truncated or corrupt") && Contains("lie outside the file"));
  CHECK_THROWS_WITH(accel::safetensors::load(write("tiny.safetensors", "abc")), Contains("shorter than the 8-byte"));
  std::string huge_header = bytes;
  huge_header[5] = '\x7f';
  CHECK_THROWS_WITH(accel::safetensors::load(write("header.safetensors", huge_header)), Contains("its header claims"));
  std::string bad_json = bytes;
  bad_json[8] = '[';
  CHECK_THROWS_WITH(accel::safetensors::load(write("json.safetensors", bad_json)), Contains("not a valid safetensors file"));
  std::string bad_dtype = bytes;
  bad_dtype.replace(bad_dtype.find("F32"), 3, "F99");
  CHECK_THROWS_WITH(accel::safetensors::load(write("dtype.safetensors", bad_dtype)), Contains("unknown dtype F99"));
  CHECK_THROWS_WITH(accel::safetensors::load(dir / "missing.safetensors"), Contains("cannot open"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("save_model / load_model: names, sharding with an index, validation before any change", "[checkpoint]") {
  const auto dir = scratch("model");
  torch::manual_seed(1);
  auto net = accel_test::mlp(4, 8, 2);
  auto bn = torch::nn::BatchNorm1d(3);
  bn->running_mean.fill_(0.5);
  accel::save_model(*net, dir / "single");
  CHECK(std::filesystem::exists(dir / "single" / "model.safetensors"));
  // Sharded: each tensor of the MLP is over 30 bytes, so a 100-byte limit gives several files and an index.
  accel::save_model(*net, dir / "sharded", 100);
  CHECK(std::filesystem::exists(dir / "sharded" / "model.safetensors.index.json"));
  CHECK(std::filesystem::exists(dir / "sharded" / "model-00001-of-00003.safetensors"));
  CHECK_FALSE(std::filesystem::exists(dir / "sharded" / "model.safetensors"));
  for (const char* where : {"single", "sharded"}) {
    torch::manual_seed(2);
    auto other = accel_test::mlp(4, 8, 2);
    REQUIRE_FALSE(accel_test::bitwise_equal(*other, *net));
    accel::load_model(*other, dir / where);
    CHECK(accel_test::bitwise_equal(*other, *net));
  }
  accel::save_model(*bn, dir / "bn");
  auto bn2 = torch::nn::BatchNorm1d(3);
  accel::load_model(*bn2, dir / "bn");
  CHECK(torch::equal(bn2->running_mean, bn->running_mean));  // buffers too
  // A model of another shape: a clear error, and nothing changed.
  auto wider = accel_test::mlp(4, 9, 2);
  auto before = wider->parameters()[0].clone();
  CHECK_THROWS_WITH(accel::load_model(*wider, dir / "single"),
                    Catch::Contains("do not fit this model; nothing was loaded") && Catch::Contains("fc1.weight"));
  CHECK(torch::equal(wider->parameters()[0], before));
  CHECK_THROWS_WITH(accel::load_model(*bn2, dir / "single"), Catch::Contains("missing: weight") && Catch::Contains("unexpected: fc1.weight"));
  std::filesystem::remove_all(dir);
}
