// A model for the fp8 tests: two Linear layers of suitable shapes (multiples of 16) between a first and a last one,
// which accel::fp8's default filter leaves in higher precision.
#pragma once

#include <torch/torch.h>

namespace accel_test {

struct tower_impl : torch::nn::Module {
  tower_impl()
      : first(register_module("first", torch::nn::Linear(16, 32))),
        a(register_module("a", torch::nn::Linear(32, 64))),
        b(register_module("b", torch::nn::Linear(64, 32))),
        last(register_module("last", torch::nn::Linear(32, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return last(torch::gelu(b(torch::gelu(a(torch::gelu(first(x))))))); }
  torch::nn::Linear first, a, b, last;
};
TORCH_MODULE_IMPL(tower, tower_impl);

}  // namespace accel_test
