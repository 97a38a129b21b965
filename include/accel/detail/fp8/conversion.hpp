/// \file
/// Which Linear layers of a model compute in float8 (Accelerate's `filter_first_and_last_linear_layers`, torchao's
/// shape rule), and whether this device's `at::_scaled_mm` takes what a recipe gives it.
// IWYU pragma: private, include <accel/fp8.hpp>
#pragma once

#include "../compat.hpp"  // ACCEL_HAS_FLOAT8: on a LibTorch without float8 this header declares nothing

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_FLOAT8
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../../options.hpp"
#include "casts.hpp"
#include "delayed_scaling.hpp"
#include "linear.hpp"

namespace accel::detail::fp8 {

/// A Linear of a model and its name there (`blocks.0.mlp.0`).
struct named_linear {
  std::string name;
  torch::nn::LinearImpl* linear;
};

/// The model's Linear layers in `named_modules` order (the order their modules were registered).
inline std::vector<named_linear> linears_of(torch::nn::Module& model) {
  std::vector<named_linear> found;
  for (const auto& item : model.named_modules())
    if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(item.value().get())) found.push_back({item.key(), linear});
  return found;
}

/// torchao's rule: float8 matmuls take dimensions in multiples of 16 (the batch's tokens are padded instead).
inline bool shape_suits(const torch::nn::LinearImpl& linear) {
  return linear.options.in_features() % 16 == 0 && linear.options.out_features() % 16 == 0;
}

/// The Linear layers of `model` to compute in float8: those of a suitable shape that `filter` keeps, or without a
/// filter all but the model's first and last Linear (Accelerate's `filter_first_and_last_linear_layers`: "for
/// stability": the embedding side and the logits).
inline std::vector<named_linear> layers_to_convert(torch::nn::Module& model, const fp8_options& options) {
  const auto all = linears_of(model);
  std::vector<named_linear> chosen;
  for (const auto& candidate : all) {
    if (!shape_suits(*candidate.linear)) continue;
    const bool keep = options.module_filter_func
                          ? options.module_filter_func(*candidate.linear, candidate.name)
                          : candidate.name != all.front().name && candidate.name != all.back().name;
    if (keep) chosen.push_back(candidate);
  }
  return chosen;
}

/// Lists `model`'s chosen layers in `table`, each with three columns of `history` under delayed scaling.
inline void convert(torch::nn::Module& model, const fp8_options& options, scaling kind, fp8_format format,
                    amax_history* history, layer_table& table) {
  for (auto& [name, linear] : layers_to_convert(model, options)) {
    layer_plan plan{.name = name,
                    .weight = linear->weight,
                    .kind = kind,
                    .format = format,
                    .pad_inner_dim = options.pad_inner_dim,
                    .emulate = options.emulate.value_or(linear->weight.device().is_cpu()),
                    .delayed = history};
    if (history && table.find(linear->weight, false) == nullptr) {
      plan.column = history->add(largest(dtype_of(format, role::input)));
      history->add(largest(dtype_of(format, role::weight)));
      history->add(largest(dtype_of(format, role::grad_output)));
    }
    table.add(std::move(plan));
  }
}

/// Runs one 16 x 16 `at::_scaled_mm` of each pairing the recipe uses (forward: input with weight; backward: the
/// gradient with each), so that a device or LibTorch that cannot (CUDA before compute capability 8.9, rowwise scales
/// before 9.0, e5m2 with e5m2 on CUDA) is refused when the accelerator is built, with LibTorch's reason.
inline void check_device(const c10::Device& device, scaling kind, fp8_format format, std::string_view policy) {
  const auto input_type = dtype_of(format, role::input), weight_type = dtype_of(format, role::weight),
             grad_type = dtype_of(format, role::grad_output);
  const auto on = at::TensorOptions().device(device);
  const auto scale_of = [&](bool rows) {
    if (kind != scaling::rowwise) return at::ones({}, on.dtype(at::kFloat));
    return rows ? at::ones({16, 1}, on.dtype(at::kFloat)) : at::ones({1, 16}, on.dtype(at::kFloat));
  };
  const std::pair<c10::ScalarType, c10::ScalarType> pairs[] = {
      {input_type, weight_type}, {grad_type, weight_type}, {grad_type, input_type}};
  for (const auto& [a_type, b_type] : pairs) {
    try {
      const auto a = at::ones({16, 16}, on).to(a_type), b = at::ones({16, 16}, on).to(b_type).t();
      (void)at::_scaled_mm(a, b, scale_of(true), scale_of(false), {}, {}, at::kBFloat16, kind != scaling::rowwise);
    } catch (const c10::Error& error) {
      throw std::invalid_argument(
          std::string(policy) + ": this LibTorch's at::_scaled_mm cannot multiply " + c10::toString(a_type) + " by " +
          c10::toString(b_type) + (kind == scaling::rowwise ? " with rowwise scales" : "") + " on " + device.str() +
          " (" + error.what_without_backtrace() + "); use another recipe or fp8_format, or accel::bf16 on this device");
    }
  }
}

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8
