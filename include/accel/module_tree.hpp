/// \file
/// `accel::describe_module`: the plain description of a torch::nn::Module that accel/device_map.hpp plans over
/// (names, class names, the bytes of each parameter and buffer, tied parameters), as Accelerate reads a torch.nn
/// model in `infer_auto_device_map`. The model may be anywhere, the meta device included: only sizes are read.
#pragma once

#include <accel/device_map.hpp>
#include <torch/nn/module.h>

#include <string>
#include <unordered_map>

#include "detail/config.hpp"

namespace accel {

namespace detail {

ACCEL_DECL module_tensor described_tensor(const std::string& name, const torch::Tensor& tensor);

/// `seen` maps each parameter's storage object to the full name it was first met under: a later name of the same
/// tensor is a tie.
ACCEL_DECL module_tree describe_module(const torch::nn::Module& module, const std::string& name,
                                       const std::string& full_name,
                                       std::unordered_map<const c10::TensorImpl*, std::string>& seen);

}  // namespace detail

/// The module tree of `module` for `infer_auto_device_map`: each module's class name is `Module::name()` (LibTorch's
/// type name, e.g. "torch::nn::LinearImpl", or the name a module gave its Module constructor), which is what
/// `no_split_module_classes` names. Bytes are each tensor's own dtype; give `device_map_options::dtype_size` (e.g.
/// `c10::elementSize(torch::kBFloat16)`) to plan for weights loaded as another dtype.
ACCEL_DECL module_tree describe_module(const torch::nn::Module& module);

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/module_tree.ipp"
#endif
