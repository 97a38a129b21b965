/// \file
/// `accel::multi_tensor_adamw`: LibTorch's `torch::optim::AdamW` whose `step()` updates all parameters of a group
/// with one multi-tensor operation per stage of the update (ATen's `_foreach_*`), as PyTorch's Python AdamW does by
/// default on CUDA (`foreach=True`). LibTorch's C++ AdamW updates each parameter with its own eight or nine
/// operations: on a GPU, where each operation is a kernel launch, that costs a model of 50 parameters about 4 ms a
/// step (docs/performance.md, "On a GPU"). Same options, same state (`AdamWParamState`, so checkpoints and the
/// sharded policies treat it as AdamW), same arithmetic in the same order: on the CPU its steps equal LibTorch's bit
/// for bit; on CUDA the multi-tensor kernels may round differently in the last place.
///
///     accel::multi_tensor_adamw optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
///     auto [model, opt] = acc.prepare(net, optimizer);
///
/// Memory: like PyTorch's foreach AdamW, a step holds one temporary the size of the group's parameters (the
/// denominators), where LibTorch's holds one parameter's at a time.
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "detail/config.hpp"
#include "detail/compat.hpp"

namespace accel {

class multi_tensor_adamw : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  ACCEL_DECL torch::Tensor step(LossClosure closure = nullptr) override;

 private:
  /// The parameters of one group that reached the same step count, with their gradients and moments: the bias
  /// corrections are per step count, so each such set is updated by one set of multi-tensor operations.
  struct same_step {
    std::vector<at::Tensor> parameters, gradients, averages, squared_averages, max_squared_averages;
  };

  ACCEL_DECL void step_group(torch::optim::OptimizerParamGroup& group);

  /// LibTorch's AdamW update of one parameter, for all of `set` at once.
  ACCEL_DECL static void update(same_step& set, std::int64_t step, const torch::optim::AdamWOptions& options);

  /// The parameter's state, made as LibTorch's AdamW makes it on its first step.
  ACCEL_DECL torch::optim::AdamWParamState& state_of(const at::Tensor& parameter,
                                                     const torch::optim::AdamWOptions& options);
};

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/multi_tensor_adamw.ipp"
#endif
