/// \file
/// `accel::multi_tensor_adamw`: LibTorch's `torch::optim::AdamW` whose `step()` updates all parameters of a group
/// with one multi-tensor operation per stage of the update (ATen's `_foreach_*`), as PyTorch's Python AdamW does by
/// default on CUDA (`foreach=True`). LibTorch's C++ AdamW updates each parameter with its own eight or nine
/// operations: on a GPU, where each operation is a kernel launch, that costs a model of 50 parameters about 4 ms a
/// step (docs/performance.md, "On a GPU"). Same options, same state (`AdamWParamState`, so checkpoints and the
/// sharded policies treat it as AdamW), same arithmetic in the same order: on the CPU its steps equal LibTorch's bit
/// for bit; on CUDA the multi-tensor kernels may round differently in the last place.
///
///     accel::multi_tensor_adamw optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
///     auto [model, opt] = acc.prepare(net, optimizer);
///
/// Memory: like PyTorch's foreach AdamW, a step holds one temporary the size of the group's parameters (the
/// denominators), where LibTorch's holds one parameter's at a time.
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "detail/compat.hpp"

namespace accel {

class multi_tensor_adamw : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure != nullptr) {
      const at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    for (auto& group : param_groups_) step_group(group);
    return loss;
  }

 private:
  /// The parameters of one group that reached the same step count, with their gradients and moments: the bias
  /// corrections are per step count, so each such set is updated by one set of multi-tensor operations.
  struct same_step {
    std::vector<at::Tensor> parameters, gradients, averages, squared_averages, max_squared_averages;
  };

  void step_group(torch::optim::OptimizerParamGroup& group) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::map<std::int64_t, same_step> by_step;
    for (const auto& parameter : group.params()) {
      if (!parameter.grad().defined()) continue;
      if (parameter.grad().is_sparse())
        throw std::invalid_argument(
            "accel::multi_tensor_adamw: a parameter has a sparse gradient, which AdamW does not support (nor does "
            "torch::optim::AdamW): give torch::nn::Embedding sparse(false)");
      auto& state = state_of(parameter, options);
      state.step(state.step() + 1);
      auto& set = by_step[state.step()];
      set.parameters.push_back(parameter);
      set.gradients.push_back(parameter.grad());
      set.averages.push_back(state.exp_avg());
      set.squared_averages.push_back(state.exp_avg_sq());
      if (options.amsgrad()) set.max_squared_averages.push_back(state.max_exp_avg_sq());
    }
    for (auto& [step, set] : by_step) update(set, step, options);
  }

  /// LibTorch's AdamW update of one parameter, for all of `set` at once.
  static void update(same_step& set, std::int64_t step, const torch::optim::AdamWOptions& options) {
    const auto [beta1, beta2] = options.betas();
    const double bias_correction1 = 1 - std::pow(beta1, step);
    const double bias_correction2 = 1 - std::pow(beta2, step);
    // The decoupled weight decay first, as LibTorch's AdamW does; nothing below reads a parameter before its update.
    if (options.weight_decay() != 0)
      at::_foreach_mul_(set.parameters, at::Scalar(1 - options.lr() * options.weight_decay()));
    at::_foreach_mul_(set.averages, at::Scalar(beta1));
    at::_foreach_add_(set.averages, set.gradients, at::Scalar(1 - beta1));
    at::_foreach_mul_(set.squared_averages, at::Scalar(beta2));
    at::_foreach_addcmul_(set.squared_averages, set.gradients, set.gradients, at::Scalar(1 - beta2));
    if (options.amsgrad()) {
      // An exact elementwise maximum: the same whether per tensor or multi-tensor.
      for (std::size_t i = 0; i < set.squared_averages.size(); ++i)
        at::max_out(set.max_squared_averages[i], set.squared_averages[i], set.max_squared_averages[i]);
    }
    auto denominators = at::_foreach_sqrt(options.amsgrad() ? set.max_squared_averages : set.squared_averages);
    at::_foreach_div_(denominators, at::Scalar(std::sqrt(bias_correction2)));
    at::_foreach_add_(denominators, at::Scalar(options.eps()));
    at::_foreach_addcdiv_(set.parameters, set.averages, denominators, at::Scalar(-options.lr() / bias_correction1));
  }

  /// The parameter's state, made as LibTorch's AdamW makes it on its first step.
  torch::optim::AdamWParamState& state_of(const at::Tensor& parameter, const torch::optim::AdamWOptions& options) {
    auto& slot = state_[detail::compat::optimizer_state_key(parameter)];
    if (!slot) {
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(0);
      state->exp_avg(torch::zeros_like(parameter, at::MemoryFormat::Preserve));
      state->exp_avg_sq(torch::zeros_like(parameter, at::MemoryFormat::Preserve));
      if (options.amsgrad()) state->max_exp_avg_sq(torch::zeros_like(parameter, at::MemoryFormat::Preserve));
      slot = std::move(state);
    }
    return static_cast<torch::optim::AdamWParamState&>(*slot);
  }
};

}  // namespace accel
