// The language model the big-model inference tests dispatch (bigmodel.offload.*): an embedding, blocks (a 2-layer
// MLP with a residual and a norm, each a shard unit, so that it can live on disk), a norm with a running-count buffer
// and a head; every parameter is in a unit, so that the whole model can be offloaded.
#pragma once

#include "accel_headers.hpp"
#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace accel_test {

struct OffloadBlockImpl : torch::nn::Module {
  OffloadBlockImpl(std::int64_t width, std::int64_t hidden)
      : torch::nn::Module("OffloadBlock"),
        up(register_module("up", torch::nn::Linear(width, hidden))),
        down(register_module("down", torch::nn::Linear(hidden, width))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))) {}
  torch::Tensor forward(const torch::Tensor& x) { return norm(x + down(torch::gelu(up(x)))); }
  torch::nn::Linear up, down;
  torch::nn::LayerNorm norm;
};
TORCH_MODULE(OffloadBlock);

struct OffloadLMImpl : torch::nn::Module {
  OffloadLMImpl(std::int64_t vocab, std::int64_t width, std::int64_t hidden, int layers)
      : torch::nn::Module("OffloadLM"),
        embed(register_module("embed", accel::shard_unit(torch::nn::Embedding(vocab, width)))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        head(register_module("head", accel::shard_unit(torch::nn::Linear(width, vocab)))) {
    for (int i = 0; i < layers; ++i) {
      units.push_back(accel::shard_unit(OffloadBlock(width, hidden)));
      blocks->push_back(units.back());
    }
    seen = register_buffer("seen", torch::zeros({1}, torch::kLong));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = embed(tokens);
    for (auto& unit : units) x = unit(x);
    return head(x);
  }
  accel::shard_unit<torch::nn::Embedding> embed;
  torch::nn::ModuleList blocks;
  std::vector<accel::shard_unit<OffloadBlock>> units;
  accel::shard_unit<torch::nn::Linear> head;
  torch::Tensor seen;
};
TORCH_MODULE(OffloadLM);

/// The bytes of `module`'s parameters.
inline std::int64_t parameter_bytes(const torch::nn::Module& module) {
  std::int64_t bytes = 0;
  for (const auto& p : module.parameters()) bytes += static_cast<std::int64_t>(p.numel() * p.element_size());
  return bytes;
}

}  // namespace accel_test
