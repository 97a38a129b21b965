/// \file
/// The per-parameter state of LibTorch's elementwise optimizers (Adam, AdamW, SGD, RMSprop, Adagrad), field by
/// field: what the sharded policies split and gather, and what a sharded checkpoint writes and reads by name.
// IWYU pragma: private, include <accel/sharded_data_parallel.hpp>
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <memory>
#include <string_view>

#include "../config.hpp"

namespace accel::detail {

/// Calls `tensor(name, at::Tensor&)` for each state tensor of a parameter's state (undefined ones included: Adam's
/// `max_exp_avg_sq` without amsgrad) and `count(name, std::int64_t&)` for its step count, where it has one; false
/// for a state of another type.
template <class OnTensor, class OnCount>
bool visit_state(torch::optim::OptimizerParamState& state, OnTensor&& tensor, OnCount&& count) {
  const auto moments = [&](auto& adam) {  // Adam's and AdamW's states: the same fields, unrelated types
    count("step", adam.step());
    tensor("exp_avg", adam.exp_avg());
    tensor("exp_avg_sq", adam.exp_avg_sq());
    tensor("max_exp_avg_sq", adam.max_exp_avg_sq());
  };
  if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    moments(*adamw);
  } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
    moments(*adam);
  } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    tensor("momentum_buffer", sgd->momentum_buffer());
  } else if (auto* rmsprop = dynamic_cast<torch::optim::RMSpropParamState*>(&state)) {
    count("step", rmsprop->step());
    tensor("square_avg", rmsprop->square_avg());
    tensor("momentum_buffer", rmsprop->momentum_buffer());
    tensor("grad_avg", rmsprop->grad_avg());
  } else if (auto* adagrad = dynamic_cast<torch::optim::AdagradParamState*>(&state)) {
    count("step", adagrad->step());
    tensor("sum", adagrad->sum());
  } else {
    return false;
  }
  return true;
}

/// Replaces each defined state tensor of a parameter's state by `transform(tensor)`; false for a state of another
/// type than the elementwise optimizers'.
template <class Transform>
bool transform_state_tensors(torch::optim::OptimizerParamState& state, Transform&& transform) {
  return visit_state(
      state,
      [&transform](std::string_view, at::Tensor& tensor) {
        if (tensor.defined()) tensor = transform(tensor);
      },
      [](std::string_view, std::int64_t&) {});
}

/// A parameter state of `optimizer`'s kind with nothing in it, for a loader to fill field by field; null for an
/// optimizer other than the elementwise ones.
ACCEL_DECL std::unique_ptr<torch::optim::OptimizerParamState> empty_state_of(const torch::optim::Optimizer& optimizer);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/optimizer_state.ipp"
#endif
