/// \file
/// `accel::describe_module`: the plain description of a torch::nn::Module that accel/device_map.hpp plans over
/// (names, class names, the bytes of each parameter and buffer, tied parameters), as Accelerate reads a torch.nn
/// model in `infer_auto_device_map`. The model may be anywhere, the meta device included: only sizes are read.
#pragma once

#include <accel/device_map.hpp>
#include <torch/nn/module.h>

#include <string>
#include <unordered_map>

namespace accel {

namespace detail {

inline module_tensor described_tensor(const std::string& name, const torch::Tensor& tensor) {
  return {.name = name,
          .elements = tensor.numel(),
          .element_size = static_cast<std::int64_t>(tensor.element_size()),
          .floating_point = tensor.is_floating_point() || tensor.is_complex()};
}

/// `seen` maps each parameter's storage object to the full name it was first met under: a later name of the same
/// tensor is a tie.
inline module_tree describe_module(const torch::nn::Module& module, const std::string& name,
                                   const std::string& full_name,
                                   std::unordered_map<const c10::TensorImpl*, std::string>& seen) {
  module_tree tree{.name = name, .class_name = module.name()};
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    if (!p.value().defined()) continue;
    const auto full = full_name.empty() ? p.key() : full_name + "." + p.key();
    auto tensor = described_tensor(p.key(), p.value());
    const auto [first, inserted] = seen.emplace(p.value().unsafeGetTensorImpl(), full);
    if (!inserted) tensor.tied_to = first->second;
    tree.parameters.push_back(std::move(tensor));
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false))
    if (b.value().defined()) tree.buffers.push_back(described_tensor(b.key(), b.value()));
  for (const auto& child : module.named_children())
    tree.children.push_back(describe_module(*child.value(), child.key(),
                                            full_name.empty() ? child.key() : full_name + "." + child.key(), seen));
  return tree;
}

}  // namespace detail

/// The module tree of `module` for `infer_auto_device_map`: each module's class name is `Module::name()` (LibTorch's
/// type name, e.g. "torch::nn::LinearImpl", or the name a module gave its Module constructor), which is what
/// `no_split_module_classes` names. Bytes are each tensor's own dtype; give `device_map_options::dtype_size` (e.g.
/// `c10::elementSize(torch::kBFloat16)`) to plan for weights loaded as another dtype.
inline module_tree describe_module(const torch::nn::Module& module) {
  std::unordered_map<const c10::TensorImpl*, std::string> seen;
  return detail::describe_module(module, "", "", seen);
}

}  // namespace accel
