// The decoder-only character transformer of examples/char_lm.cpp, in a header of its own so that the GPU checks and
// benchmarks train the same model (tests/programs/mixed_precision_training.cpp, bench/gpu_step.cpp).
// examples/char_transformer.py is the same model in PyTorch: the same operations in the same order, and the same
// parameter names, so that weights cross between the two through safetensors.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include <accel/context_parallel.hpp>

// Causal multi-head self-attention: each position attends to itself and to the positions before it.
struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(int64_t dim, int64_t head_count)
      : heads(head_count),
        qkv(register_module("qkv", torch::nn::Linear(dim, 3 * dim))),
        out(register_module("out", torch::nn::Linear(dim, dim))) {}

  torch::Tensor forward(const torch::Tensor& x) {  // x: [batch, time, dim]
    // The heads this process computes: all, or under tensor parallelism (qkv column-parallel with its three parts
    // split, out row-parallel) heads / tp of them, `width` = their dim / heads features each. The time is the
    // projection's: with sequence parallelism x holds this process's part of the sequence, and qkv gathers it whole.
    const auto projected = qkv(x);
    const auto batch = projected.size(0), time = projected.size(1), dim = x.size(2);
    const auto width = projected.size(-1) / 3, local_heads = width / (dim / heads);
    // Queries, keys and values of every head: [3, batch, heads, time, dim / heads].
    const auto qkv_heads = projected.view({batch, time, 3, local_heads, dim / heads}).permute({2, 0, 3, 1, 4});
    // Scores divided by sqrt(dim / heads), the future masked, softmax, values weighted: LibTorch's operations, or
    // under context parallelism (accel::maybe_context_parallel) ring attention over the whole sequence.
    const auto mixed = accel::scaled_dot_product_attention(qkv_heads[0], qkv_heads[1], qkv_heads[2],
                                                           {.is_causal = true});  // [batch, heads, time, dim / heads]
    return out(mixed.transpose(1, 2).reshape({batch, time, width}));              // heads side by side again
  }

  int64_t heads;
  torch::nn::Linear qkv, out;
};
TORCH_MODULE(SelfAttention);

// A transformer block, normalised before each part: x + attention(norm(x)), then x + mlp(norm(x)). Dropout on
// both branches while training, because 28 KB of text is soon learnt by heart.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t heads, double dropout)
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        attention(register_module("attention", SelfAttention(dim, heads))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        mlp(register_module("mlp", torch::nn::Sequential(torch::nn::Linear(dim, 4 * dim), torch::nn::GELU(),
                                                         torch::nn::Linear(4 * dim, dim)))),
        drop(register_module("drop", torch::nn::Dropout(dropout))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = x + drop(attention(norm1(x)));
    return x + drop(mlp->forward(norm2(x)));
  }

  torch::nn::LayerNorm norm1;
  SelfAttention attention;
  torch::nn::LayerNorm norm2;
  torch::nn::Sequential mlp;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

// Decoder-only transformer: token and position embeddings, blocks, a final norm, and logits for the next character.
struct CharTransformerImpl : torch::nn::Module {
  CharTransformerImpl(int64_t vocabulary, int64_t context, int64_t dim, int64_t heads, int64_t layers, double dropout)
      : token_embedding(register_module("token_embedding", torch::nn::Embedding(vocabulary, dim))),
        position_embedding(register_module("position_embedding", torch::nn::Embedding(context, dim))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        head(register_module("head", torch::nn::Linear(dim, vocabulary))) {
    for (int64_t i = 0; i < layers; ++i) blocks->push_back(Block(dim, heads, dropout));
  }

  torch::Tensor forward(const torch::Tensor& tokens) {  // [batch, time] -> logits [batch, time, vocabulary]
    return forward(tokens, torch::arange(tokens.size(1), tokens.options()));
  }
  // `positions` [time]: the tokens' places in their sequences (under context parallelism, this process's part of
  // them, cut as the tokens are).
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& positions) {
    auto x = token_embedding(tokens) + position_embedding(positions);
    for (const auto& block : *blocks) x = block->as<Block>()->forward(x);
    return head(norm(x));
  }

  torch::nn::Embedding token_embedding, position_embedding;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm norm;
  torch::nn::Linear head;
};
TORCH_MODULE(CharTransformer);
