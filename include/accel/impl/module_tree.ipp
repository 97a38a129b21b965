/// \file
/// What module_tree.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../module_tree.hpp"

namespace accel::detail {

module_tensor described_tensor(const std::string& name, const torch::Tensor& tensor) {
  return {.name = name,
          .elements = tensor.numel(),
          .element_size = static_cast<std::int64_t>(tensor.element_size()),
          .floating_point = tensor.is_floating_point() || tensor.is_complex()};
}

module_tree describe_module(const torch::nn::Module& module, const std::string& name, const std::string& full_name,
                            first_names& seen) {
  module_tree tree{.name = name, .class_name = module.name()};
  if (const auto [first, inserted] = seen.modules.emplace(&module, full_name); !inserted)
    tree.shared_with = first->second;
  const auto described = [&](const std::string& key, const torch::Tensor& value) {
    auto tensor = described_tensor(key, value);
    const auto full = full_name.empty() ? key : full_name + "." + key;
    const auto [first, inserted] = seen.tensors.emplace(value.unsafeGetTensorImpl(), full);
    if (!inserted) tensor.tied_to = first->second;
    return tensor;
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false))
    if (p.value().defined()) tree.parameters.push_back(described(p.key(), p.value()));
  for (const auto& b : module.named_buffers(/*recurse=*/false))
    if (b.value().defined()) tree.buffers.push_back(described(b.key(), b.value()));
  for (const auto& child : module.named_children())
    tree.children.push_back(describe_module(*child.value(), child.key(),
                                            full_name.empty() ? child.key() : full_name + "." + child.key(), seen));
  return tree;
}
}  // namespace accel::detail

namespace accel {

module_tree describe_module(const torch::nn::Module& module) {
  detail::first_names seen;
  return detail::describe_module(module, "", "", seen);
}

}  // namespace accel
