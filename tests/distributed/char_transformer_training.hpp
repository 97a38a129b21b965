// char_lm's transformer (examples/char_transformer.hpp) as the multi-process tests train it: small, its batches, its
// optimizer, Megatron's split of it, and one process training it on the whole batch, the reference that tensor and
// context parallelism's runs must equal (distributed/test_tensor_parallel.cpp, test_context_parallel.cpp).
#pragma once

#include "support.hpp"

#include <string>
#include <utility>
#include <vector>

#include "char_transformer.hpp"

namespace accel_test {

/// Steps of the parity runs.
inline constexpr int transformer_steps = 50;

/// Small: vocabulary 24, context 8, dim 16, 4 heads, 2 blocks, no dropout.
inline CharTransformer char_transformer() { return CharTransformer(24, 8, 16, 4, 2, 0.0); }

/// Megatron's split of it: the token embedding by its vocabulary, each block's attention (qkv column-parallel, its
/// query, key and value parts each split: whole heads per rank; out row-parallel) and MLP, and the output layer.
inline accel::tensor_parallel_plan char_transformer_plan() {
  accel::tensor_parallel_plan plan{{"token_embedding", accel::rowwise_parallel{}}, {"head", accel::colwise_parallel{}}};
  for (const std::string block : {"blocks.0.", "blocks.1."}) {
    plan.emplace_back(block + "attention.qkv", accel::colwise_parallel{.fused = 3});
    plan.emplace_back(block + "attention.out", accel::rowwise_parallel{});
    plan.emplace_back(block + "mlp.0", accel::colwise_parallel{});
    plan.emplace_back(block + "mlp.2", accel::rowwise_parallel{});
  }
  return plan;
}

/// SGD with momentum, not AdamW: the key projection's bias has no gradient but rounding noise (softmax ignores what
/// it adds to every key alike), which AdamW's m / sqrt(v) would blow up to whole steps in either run.
inline torch::optim::SGDOptions transformer_sgd() { return torch::optim::SGDOptions(0.1).momentum(0.9); }

/// Character batch `i`: ids and the next ids, [4, 8].
inline std::pair<torch::Tensor, torch::Tensor> characters(int i) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(3000 + i);
  return {torch::randint(24, {4, 8}, generator), torch::randint(24, {4, 8}, generator)};
}

/// The transformer trained alone, unsplit, `steps` steps, each on the job's whole global batch (the `dp` ranks'
/// batches together): the reference of the split runs. Returns its parameters.
inline std::vector<torch::Tensor> train_char_transformer_alone(int dp, int steps = transformer_steps) {
  torch::manual_seed(6);
  auto net = char_transformer();
  torch::optim::SGD optimizer(net->parameters(), transformer_sgd());
  for (int step = 0; step < steps; ++step) {
    std::vector<torch::Tensor> xs, ys;
    for (int r = 0; r < dp; ++r) {
      auto [x, y] = characters(step * dp + r);
      xs.push_back(x);
      ys.push_back(y);
    }
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(torch::cat(xs)).reshape({-1, 24}), torch::cat(ys).reshape({-1}))
        .backward();
    optimizer.step();
  }
  std::vector<torch::Tensor> parameters;
  for (const auto& p : net->parameters()) parameters.push_back(p.detach().clone());
  return parameters;
}

}  // namespace accel_test
