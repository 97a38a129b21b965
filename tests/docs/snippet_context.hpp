// What the C++ blocks of docs/ take from their context: the objects a fragment of a training loop uses without
// declaring them (`acc`, `net`, `optimizer`, `model`, `batches`, ...), and the user's own functions and types that the
// docs name (`train`, `Block`, ...). tests/scripts/docs_snippets.py compiles each block inside namespace accel_docs
// (the default context), or inside one of the contexts nested in it (`<!-- snippet: context NAME -->` before the
// fence), whose declarations hide the default's of the same name. A block's own declarations hide both.
//
// Only declared: the units are compiled, never linked or run.
#pragma once

#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace accel_docs {

// A model of blocks: `Block(width)` maps (batch, width) to (batch, width).
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(std::int64_t width) : linear(register_module("linear", torch::nn::Linear(width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(linear(x)); }
  torch::nn::Linear linear;
};
TORCH_MODULE(Block);

// `Net(blocks)`: that many blocks, each a unit of accel::fully_sharded.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(int blocks) {
    for (int i = 0; i < blocks; ++i)
      units.push_back(register_module("block" + std::to_string(i), accel::shard_unit(Block(16))));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& unit : units) x = unit(x);
    return x;
  }
  std::vector<accel::shard_unit<Block>> units;
};
TORCH_MODULE(Net);

// A model of the user's, its blocks registered as Module("Block").
struct MyModelImpl : torch::nn::Module {
  MyModelImpl() { register_module("blocks", torch::nn::Sequential(Block(16), Block(16))); }
};
TORCH_MODULE(MyModel);

// The default context: one process in fp32, a linear model, SGD, and batches of (input, target) pairs.
extern accel::accelerator<> acc;
extern torch::nn::Linear net;
extern torch::nn::Linear reward_net;
extern torch::optim::SGD optimizer;
extern torch::optim::StepLR scheduler;
extern std::vector<std::pair<at::Tensor, at::Tensor>> data;     // batches
extern std::vector<std::pair<at::Tensor, at::Tensor>> samples;  // samples
extern std::vector<std::pair<at::Tensor, at::Tensor>> records_from_socket;
extern std::vector<torch::data::Example<>> dataset;
extern std::vector<torch::data::Example<>> images;
extern std::vector<at::Tensor> inputs;
extern std::vector<at::Tensor> targets;
extern std::vector<std::vector<at::Tensor>> ragged_batches;  // batches of samples of different lengths
extern accel::data_loader<std::vector<std::pair<at::Tensor, at::Tensor>>&> loader;
// What `auto [model, opt, batches] = acc.prepare(net, optimizer, data);` gives.
using prepared = decltype(acc.prepare(net, optimizer, data));
extern std::tuple_element_t<0, prepared> model;
extern std::tuple_element_t<1, prepared> opt;
extern std::tuple_element_t<2, prepared> batches;
extern std::tuple_element_t<2, prepared> train_batches;
extern accel::profiler prof;

extern at::Tensor loss;
extern at::Tensor loss_sum;
extern at::Tensor tokens;
extern int epoch;
extern int num_epochs;
extern std::int64_t step;
extern std::int64_t saved_epoch;
extern std::size_t saved_batch;
extern int observed_batch_size;
extern int local_count;
extern std::int64_t vocab;
extern std::int64_t width;
extern int layers;
extern std::filesystem::path path;
extern accel::options options;
struct settings {};
extern std::optional<settings> s;
extern std::function<void()> function;

// The user's functions.
template <class... Args>
double train(Args&&...);
void train_one_epoch();
void prepare_cache(const std::filesystem::path&);
std::string save_weights(const torch::nn::Linear&);
template <class... Args>
void use(const Args&...);
std::vector<double> train_alone();
std::string train_and_serialize();
std::string serialize(const std::vector<at::Tensor>&);
std::vector<double> deserialize(const std::string&);

}  // namespace accel_docs

// The contexts a marker chooses, each a namespace of its own (`namespace accel_docs::NAME {` at the start of a line).

// `batches` as the user holds them before prepare: a std::vector of (input, target) pairs.
namespace accel_docs::unprepared {
extern std::vector<std::pair<at::Tensor, at::Tensor>> batches;
}  // namespace accel_docs::unprepared

// GoogleTest's macros, as far as docs/testing.md's GoogleTest case uses them (the tests do not build GoogleTest).
#define TEST(suite, name) void suite##_##name()
#define EXPECT_EQ(a, b) (void)((a) == (b))
#define EXPECT_THROW(statement, exception) \
  try {                                    \
    statement;                             \
  } catch (const exception&) {             \
  }
