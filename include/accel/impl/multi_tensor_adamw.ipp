/// \file
/// What multi_tensor_adamw.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../multi_tensor_adamw.hpp"

namespace accel {

torch::Tensor multi_tensor_adamw::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    const at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) step_group(group);
  return loss;
}

void multi_tensor_adamw::step_group(torch::optim::OptimizerParamGroup& group) {
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

void multi_tensor_adamw::update(same_step& set, std::int64_t step, const torch::optim::AdamWOptions& options) {
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

torch::optim::AdamWParamState& multi_tensor_adamw::state_of(const at::Tensor& parameter,
                                                            const torch::optim::AdamWOptions& options) {
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

}  // namespace accel
