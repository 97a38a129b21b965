/// \file
/// What float8_gather.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../float8_gather.hpp"

#if ACCEL_HAS_FLOAT8

namespace accel::detail::fp8 {

at::Tensor float8_gather::local_maximum(const at::Tensor& slice) const {
  if (slice.numel() == 0) return at::zeros({}, slice.options().dtype(at::kFloat));
  return amax(slice, std::nullopt).to(at::kFloat);
}

at::Tensor float8_gather::encode(const at::Tensor& slice, const at::Tensor& maximum) const {
  return cast_in_range(slice, amax_to_scale(maximum, type_, false), type_);  // the group's amax covers the slice
}

void float8_gather::gathered(const at::Tensor& parameter, const at::Tensor& encoded, const at::Tensor& maximum) {
  if (auto* plan = layers_->plan_of(parameter)) plan->gathered = scaled{encoded, amax_to_scale(maximum, type_, false)};
}

void refuse_tied_gathered_weights(torch::nn::Module& model, const layer_table& layers, std::string_view policy) {
  std::unordered_map<const void*, std::vector<std::pair<const torch::nn::Module*, std::string>>> holders;
  for (const auto& item : model.named_modules())
    for (const auto& parameter : item.value()->named_parameters(/*recurse=*/false))
      holders[parameter.value().unsafeGetTensorImpl()].emplace_back(
          item.value().get(), item.key().empty() ? parameter.key() : item.key() + "." + parameter.key());
  for (const auto& plan : layers.plans()) {
    const auto found = holders.find(plan.weight.unsafeGetTensorImpl());
    if (found == holders.end()) continue;
    const torch::nn::Module* linear = nullptr;  // the layer's own module
    for (const auto& [module, name] : found->second)
      if (name == plan.name + ".weight") linear = module;
    for (const auto& [module, name] : found->second)
      if (module != linear)
        throw std::invalid_argument(std::string(policy) +
                                    ": options.fp8.enable_fsdp_float8_all_gather gathers the weight of " + plan.name +
                                    " in float8 only, but it is also " + name +
                                    " (a tied weight), which would compute with the float8 values there; leave " +
                                    plan.name + " out with options.fp8.module_filter_func, or the option false");
  }
}

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8
