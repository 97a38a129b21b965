/// \file
/// Tensor parallelism's layers (Megatron-LM's column- and row-parallel Linear): which Linear layers of a model are
/// split across the "tp" group and how, found by their weight while tensor_parallel's forward scope is alive
/// (detail/support/linear_routing.hpp), and the two autograd functions that carry their one all-reduce each way:
/// `copy_to_region` (identity forward, the input's gradient all-reduced in backward) before a column-parallel layer,
/// `reduce_from_region` (the partial outputs all-reduced forward, identity backward) after a row-parallel one.
// IWYU pragma: private, include <accel/tensor_parallel.hpp>
#pragma once

#include "../compat.hpp"  // ACCEL_HAS_LINEAR_ROUTING

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_LINEAR_ROUTING
#include <torch/autograd.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include "../../collectives.hpp"
#include "../support/linear_routing.hpp"

namespace accel {

/// The all-reduces tensor parallelism ran on its "tp" group since the policy was made: one per column/row-parallel
/// pair in forward (the row-parallel layer's partial sums) and one in backward (the column-parallel layer's input
/// gradient, when its input needs one).
struct tensor_parallel_counts {
  std::int64_t forward_all_reduces = 0;
  std::int64_t backward_all_reduces = 0;
  friend bool operator==(const tensor_parallel_counts&, const tensor_parallel_counts&) = default;
};

namespace detail::tp {

/// How a split layer keeps its slice: a column-parallel Linear keeps rows [r out / tp, (r + 1) out / tp) of its
/// weight (and of its bias), a row-parallel one the columns [r in / tp, (r + 1) in / tp) (its bias whole, added once
/// after the all-reduce), a vocabulary-parallel Embedding the rows [r vocab / tp, (r + 1) vocab / tp) of its table.
enum class split { columns_of_output, rows_of_input, vocabulary };

/// One split layer: its name in the model, its weight and bias parameters (the user's own, holding this rank's
/// slice), the split, and where the slice starts along the split dimension.
struct layer {
  std::string name;
  at::Tensor weight;
  at::Tensor bias;  // undefined without one
  split kind;
  std::int64_t first;
  std::int64_t fused = 1;  // a column-parallel output of that many parts side by side, each split

  /// The dimension of the weight that is split across the group.
  [[nodiscard]] std::int64_t weight_dimension() const noexcept { return kind == split::rows_of_input ? 1 : 0; }
  /// Whether `parameter` is one of this layer's split parameters (the weight; a column-parallel layer's bias).
  [[nodiscard]] bool splits(const at::Tensor& parameter) const noexcept {
    const auto* impl = parameter.unsafeGetTensorImpl();
    return impl == weight.unsafeGetTensorImpl() ||
           (kind == split::columns_of_output && bias.defined() && impl == bias.unsafeGetTensorImpl());
  }
};

/// The "tp" group as the autograd functions use it: an in-place all-reduce over the group, and the count of the
/// layers' all-reduces each way.
struct region {
  std::function<void(at::Tensor&, reduction)> all_reduce;
  tensor_parallel_counts counts;
};

// The region travels through autograd's saved data as an integer: it lives on the heap as long as the policy.
inline std::int64_t handle_of(region& group) {
  return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&group));
}
inline region& region_of(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<region*>(static_cast<std::intptr_t>(ctx->saved_data["region"].toInt()));
}

/// The input of a column-parallel layer: the same on every rank forward; its gradient, a partial sum on each rank,
/// all-reduced in backward (Megatron's `copy_to_tensor_model_parallel_region`, DTensor's Replicate input).
struct copy_to_region : torch::autograd::Function<copy_to_region> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, region& group) {
    ctx->saved_data["region"] = handle_of(group);
    return x.clone();  // an output of its own: autograd then needs no view bookkeeping
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto& group = region_of(ctx);
    auto summed = grads[0].contiguous().clone();
    group.all_reduce(summed, reduction::sum);
    ++group.counts.backward_all_reduces;
    return {summed, at::Tensor()};
  }
};

/// The output of a row-parallel layer: each rank's partial product all-reduced forward; the gradient, the same on
/// every rank, passed through in backward (Megatron's `reduce_from_tensor_model_parallel_region`).
struct reduce_from_region : torch::autograd::Function<reduce_from_region> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& partial, region& group) {
    auto summed = partial.contiguous().clone();
    group.all_reduce(summed, reduction::sum);
    ++group.counts.forward_all_reduces;
    return summed;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

/// Megatron's `_VocabParallelCrossEntropy`: the cross-entropy of each row of logits whose vocabulary is split across
/// the group (this rank's columns start at `first`), without gathering them: the rows' maxima (MAX), the target's
/// logit (SUM: only its owner has it) and the sums of exponentials (SUM) all-reduced; backward is local,
/// softmax minus the target's one-hot, on this rank's columns.
struct vocab_parallel_cross_entropy : torch::autograd::Function<vocab_parallel_cross_entropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            std::int64_t first, region& group) {
    auto maximum = std::get<0>(logits.max(-1)).contiguous();
    group.all_reduce(maximum, reduction::max);
    const auto shifted = logits - maximum.unsqueeze(-1);
    const auto local = targets - first;
    const auto outside = local.lt(0).logical_or(local.ge(logits.size(-1)));
    const auto column = local.masked_fill(outside, 0);
    auto target_logit = shifted.gather(-1, column.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0).contiguous();
    group.all_reduce(target_logit, reduction::sum);
    const auto exponentials = shifted.exp();
    auto sums = exponentials.sum(-1).contiguous();
    group.all_reduce(sums, reduction::sum);
    ctx->save_for_backward({exponentials / sums.unsqueeze(-1), column, outside});
    return sums.log() - target_logit;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &softmax = saved[0], &column = saved[1], &outside = saved[2];
    const auto owned = outside.logical_not().to(softmax.scalar_type()).unsqueeze(-1);
    auto grad = softmax.scatter_add(-1, column.unsqueeze(-1), -owned);
    return {grad * grads[0].unsqueeze(-1), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

/// `Function::apply`, with GCC 13's false positive inside LibTorch silenced (as fp8's linear.hpp does).
template <class Function, class... Args>
at::Tensor apply_function(region& group, const Args&... args) {
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#endif
  return Function::apply(args..., group);
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
#pragma GCC diagnostic pop
#endif
}

/// The split layers of a model, the router of tensor_parallel's forward scope.
class layer_router : public routing::linear_router {
 public:
  explicit layer_router(std::function<void(at::Tensor&, reduction)> all_reduce) {
    group_.all_reduce = std::move(all_reduce);
  }

  [[nodiscard]] std::optional<at::Tensor> route(const at::Tensor& input, const at::Tensor& operand, bool transposed,
                                                const at::Tensor* bias) const override {
    for (const auto& split_layer : layers_)
      if (split_layer.kind != split::vocabulary && routing::is_weight(operand, split_layer.weight, transposed))
        return compute(input, split_layer, bias);
    return std::nullopt;
  }
  [[nodiscard]] std::optional<at::Tensor> route_embedding(const at::Tensor& weight,
                                                          const at::Tensor& indices) const override {
    for (const auto& split_layer : layers_)
      if (split_layer.kind == split::vocabulary && routing::is_weight(weight, split_layer.weight, false))
        return embed(indices, split_layer);
    return std::nullopt;
  }

  void add(layer split_layer) { layers_.push_back(std::move(split_layer)); }
  [[nodiscard]] const std::deque<layer>& layers() const noexcept { return layers_; }
  /// The split layer `parameter` is a split parameter of, or none (replicated).
  [[nodiscard]] const layer* split_of(const at::Tensor& parameter) const noexcept {
    for (const auto& split_layer : layers_)
      if (split_layer.splits(parameter)) return &split_layer;
    return nullptr;
  }
  [[nodiscard]] const tensor_parallel_counts& counts() const noexcept { return group_.counts; }
  /// The group, for the parallel cross-entropy.
  [[nodiscard]] region& group() const noexcept { return group_; }

 private:
  at::Tensor compute(const at::Tensor& input, const layer& split_layer, const at::Tensor* bias) const {
    const at::Tensor no_bias;
    if (split_layer.kind == split::columns_of_output)
      return at::linear(apply_function<copy_to_region>(group_, input), split_layer.weight, bias ? *bias : no_bias);
    auto out = apply_function<reduce_from_region>(group_, at::linear(input, split_layer.weight, no_bias));
    return bias != nullptr ? out + *bias : out;  // once, after the sum
  }
  /// Megatron's vocabulary-parallel embedding: the ids outside this rank's rows look up row 0 and are zeroed, then
  /// the ranks' outputs summed (each id's row comes from its owner alone).
  at::Tensor embed(const at::Tensor& indices, const layer& split_layer) const {
    const auto local = indices - split_layer.first;
    const auto outside = local.lt(0).logical_or(local.ge(split_layer.weight.size(0)));
    const auto rows = at::embedding(split_layer.weight, local.masked_fill(outside, 0));
    return apply_function<reduce_from_region>(group_, rows.masked_fill(outside.unsqueeze(-1), 0));
  }

  mutable region group_;  // the autograd functions count into it
  std::deque<layer> layers_;
};

}  // namespace detail::tp
}  // namespace accel

#endif  // ACCEL_HAS_LINEAR_ROUTING
