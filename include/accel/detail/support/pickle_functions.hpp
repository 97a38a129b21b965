/// \file
/// LibTorch's `torch::jit::pickle_save` and `pickle_load`, declared as torch/csrc/jit/serialization/pickle.h declares
/// them (alike in LibTorch 1.13 and 2.x). That header also brings TorchScript's frontend (its unpickler's type
/// parser), which parsing costs every file that compiles accel's collectives header-only, and none of it is needed
/// to pickle an IValue.
// IWYU pragma: private, include <accel/collectives.hpp>
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/macros/Export.h>

#include <vector>

namespace torch::jit {

TORCH_API std::vector<char> pickle_save(const c10::IValue& ivalue);
TORCH_API c10::IValue pickle_load(const std::vector<char>& data);

}  // namespace torch::jit
