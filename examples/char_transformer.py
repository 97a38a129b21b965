"""The character transformer of examples/char_transformer.hpp in PyTorch: the same operations in the same order and
the same parameter names, so that its state_dict and the C++ module's parameters cross through safetensors and the
two train alike (tests/scripts/check_mixed_precision.py, bench/gpu_step.py).

With `linear=LibTorchLinear` its layers compute as LibTorch's C++ torch::nn::Linear does, which is not quite
Python's nn.Linear: see LibTorchLinear."""
import math

import torch
from torch import nn


class LibTorchLinear(nn.Linear):
    """nn.Linear computed as LibTorch's C++ torch::nn::Linear computes it (torch::nn::functional::linear): addmm for
    2-d inputs, else the product and then the bias added in place, where Python's nn.Linear makes one aten::linear of
    both. Under autocast the two differ: the in-place addition rounds the float16/bfloat16 product before adding the
    bias (measured on the CPU: losses 2e-5 apart in bf16 after one forward, identical in fp32)."""

    def forward(self, x):
        if x.dim() == 2:
            return torch.addmm(self.bias, x, self.weight.t())
        output = x.matmul(self.weight.t())
        output += self.bias
        return output


class SelfAttention(nn.Module):
    """Causal multi-head self-attention: each position attends to itself and to the positions before it."""

    def __init__(self, dim, heads, linear=nn.Linear):
        super().__init__()
        self.heads = heads
        self.qkv = linear(dim, 3 * dim)
        self.out = linear(dim, dim)

    def forward(self, x):
        batch, time, dim = x.shape
        qkv_heads = self.qkv(x).view(batch, time, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv_heads[0], qkv_heads[1], qkv_heads[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dim // self.heads)
        future = torch.ones(time, time, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, -math.inf)
        mixed = torch.matmul(scores.softmax(-1), v)
        return self.out(mixed.transpose(1, 2).reshape(batch, time, dim))


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x)), dropout on both branches."""

    def __init__(self, dim, heads, dropout, linear=nn.Linear):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = SelfAttention(dim, heads, linear)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(linear(dim, 4 * dim), nn.GELU(), linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.drop(self.attention(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


class CharTransformer(nn.Module):
    """Token and position embeddings, blocks, a final norm, logits for the next character."""

    def __init__(self, vocabulary, context, dim, heads, layers, dropout, linear=nn.Linear):
        super().__init__()
        self.token_embedding = nn.Embedding(vocabulary, dim)
        self.position_embedding = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout, linear) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = linear(dim, vocabulary)

    def forward(self, tokens):
        positions = torch.arange(tokens.size(1), dtype=tokens.dtype, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
