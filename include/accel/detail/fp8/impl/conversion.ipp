/// \file
/// What conversion.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../conversion.hpp"

#if ACCEL_HAS_FLOAT8

namespace accel::detail::fp8 {

std::vector<named_linear> linears_of(torch::nn::Module& model) {
  std::vector<named_linear> found;
  for (const auto& item : model.named_modules())
    if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(item.value().get())) found.push_back({item.key(), linear});
  return found;
}

bool shape_suits(const torch::nn::LinearImpl& linear) {
  return linear.options.in_features() % 16 == 0 && linear.options.out_features() % 16 == 0;
}

std::vector<named_linear> layers_to_convert(torch::nn::Module& model, const fp8_options& options) {
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

void convert(torch::nn::Module& model, const fp8_options& options, scaling kind, fp8_format format,
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

void check_device(const c10::Device& device, scaling kind, fp8_format format, std::string_view policy) {
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
