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

/// The full names each tensor and module instance was first met under: a later name of the same tensor is a tie (a
/// buffer's only counts once), of the same module a registration shared with the first.
struct first_names {
  std::unordered_map<const c10::TensorImpl*, std::string> tensors;
  std::unordered_map<const torch::nn::Module*, std::string> modules;
};

ACCEL_DECL module_tree describe_module(const torch::nn::Module& module, const std::string& name,
                                       const std::string& full_name, first_names& seen);

}  // namespace detail

/// The module tree of `module` for `infer_auto_device_map`: each module's class name is `Module::name()` (LibTorch's
/// type name, e.g. "torch::nn::LinearImpl", or the name a module gave its Module constructor; an `accel::shard_unit`'s
/// is its wrapped module's), which is what `no_split_module_classes` names. A tensor or module met again under
/// another name is marked so (`module_tensor::tied_to`, `module_tree::shared_with`), and counts once. Bytes are each
/// tensor's own dtype; give `device_map_options::dtype_size` (e.g. `c10::elementSize(torch::kBFloat16)`) to plan for
/// weights loaded as another dtype.
ACCEL_DECL module_tree describe_module(const torch::nn::Module& module);

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/module_tree.ipp"
#endif
