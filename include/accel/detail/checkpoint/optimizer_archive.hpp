/// \file
/// An optimizer's state as a LibTorch archive, with its learning rates: what a checkpoint writes of each optimizer
/// and what `join_uneven_inputs` sends from the last process to stop to the others.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "../config.hpp"

namespace accel::detail {

/// An optimizer's archive: LibTorch's, plus its groups' learning rates, which LibTorch's `load` does not restore
/// (a scheduler's work).
ACCEL_DECL void save_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::OutputArchive& archive);
ACCEL_DECL void load_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive);

/// Moves each state tensor of `optimizer` onto its parameter's device, where PyTorch's `load_state_dict` puts it and
/// LibTorch's `Optimizer::load` does not: it leaves them where the archive was read to, `read_to`. The elementwise
/// optimizers' fields move one by one; another optimizer's state (LBFGS's) is read again from its own archive onto
/// the parameter's device, when that is not `read_to`.
ACCEL_DECL void place_state_on_parameters(torch::optim::Optimizer& optimizer, const c10::Device& read_to);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/optimizer_archive.ipp"
#endif
