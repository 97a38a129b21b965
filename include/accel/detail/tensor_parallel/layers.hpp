/// \file
/// Tensor parallelism's layers (Megatron-LM's column- and row-parallel Linear): which Linear layers of a model are
/// split across the "tp" group and how, found by their weight while tensor_parallel's forward scope is alive
/// (detail/support/linear_routing.hpp), and the two autograd functions that carry their one all-reduce each way:
/// `copy_to_region` (identity forward, the input's gradient all-reduced in backward) before a column-parallel layer,
/// `reduce_from_region` (the partial outputs all-reduced forward, identity backward) after a row-parallel one; with
/// sequence parallelism, `gather_from_sequence` (all-gather forward, reduce-scatter backward) and
/// `reduce_scatter_to_sequence` (the mirror) in their places, and `scatter_to_sequence` for a position embedding.
// IWYU pragma: private, include <accel/tensor_parallel.hpp>
#pragma once

#include "../config.hpp"
#include "../compat.hpp"  // ACCEL_HAS_LINEAR_ROUTING

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_LINEAR_ROUTING
#include <torch/autograd.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../collectives.hpp"
#include "../support/linear_routing.hpp"

namespace accel {

/// The collectives tensor parallelism ran on its "tp" group since the policy was made. Without sequence parallelism:
/// one all-reduce per column/row-parallel pair in forward (the row-parallel layer's partial sums) and one in backward
/// (the column-parallel layer's input gradient, when its input needs one). With it, each of those all-reduces is an
/// all-gather and a reduce-scatter along the sequence: forward, a column-parallel layer all-gathers its input and a
/// row-parallel one reduce-scatters its output; backward, the mirror. `gradient_all_reduces`: the gradients of the
/// parameters that see a sequence shard (sequence_parallel norms, a sequence-parallel row-parallel layer's bias),
/// summed over the group once per backward each. `amax_all_reduces`: under fp8 with dynamic scaling, the amaxes of the
/// split layers' operands that span a split dimension, maxed over the group (a column-parallel layer's weight forward
/// and output gradient backward, a row-parallel layer's input and weight forward: tensorwise, one each).
struct tensor_parallel_counts {
  std::int64_t forward_all_reduces = 0;
  std::int64_t backward_all_reduces = 0;
  std::int64_t forward_all_gathers = 0;
  std::int64_t forward_reduce_scatters = 0;
  std::int64_t backward_all_gathers = 0;
  std::int64_t backward_reduce_scatters = 0;
  std::int64_t gradient_all_reduces = 0;
  std::int64_t amax_all_reduces = 0;
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
  /// Sequence parallelism: the dimension of the activations along which the sequence is split (a column-parallel
  /// layer's input, a row-parallel layer's or the embedding's output); none without it.
  std::optional<std::int64_t> sequence_dim = std::nullopt;

  /// The dimension of the weight that is split across the group.
  [[nodiscard]] std::int64_t weight_dimension() const noexcept { return kind == split::rows_of_input ? 1 : 0; }
  /// Whether `parameter` is one of this layer's split parameters (the weight; a column-parallel layer's bias).
  [[nodiscard]] ACCEL_DECL bool splits(const at::Tensor& parameter) const noexcept;
};

/// The "tp" group as the autograd functions use it: an in-place all-reduce over the group, a flat all-gather and a
/// flat sum reduce-scatter (a communicator's `all_gather_into` and `reduce_scatter_into`), this rank and the size,
/// and the count of the layers' collectives each way.
struct region {
  std::function<void(at::Tensor&, reduction)> all_reduce;
  std::function<void(at::Tensor& output, at::Tensor& input)> all_gather;
  std::function<void(at::Tensor& output, at::Tensor& input)> reduce_scatter;
  int rank = 0;
  int size = 1;
  tensor_parallel_counts counts;
};

// The region travels through autograd's saved data as an integer: it lives on the heap as long as the policy.
inline std::int64_t handle_of(region& group) {
  return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&group));
}
ACCEL_DECL region& region_of(torch::autograd::AutogradContext* ctx);

/// `x` with `dimension` first, contiguous: the group's parts along it are then the flat segments the collectives
/// take.
inline at::Tensor leading(const at::Tensor& x, std::int64_t dimension) { return x.movedim(dimension, 0).contiguous(); }
/// `x` (made with `dimension` first) with `dimension` back in its place: an output of its own, not a view (autograd
/// then needs no view bookkeeping).
inline at::Tensor put_back(const at::Tensor& x, std::int64_t dimension) {
  return dimension == 0 ? x : x.movedim(0, dimension).contiguous();
}
/// Every rank's `x` side by side along `dimension`, in rank order.
ACCEL_DECL at::Tensor all_gather_along(region& group, const at::Tensor& x, std::int64_t dimension);
/// This rank's part along `dimension` of the sum of every rank's `x` (the size there divides by the group's).
ACCEL_DECL at::Tensor reduce_scatter_along(region& group, const at::Tensor& x, std::int64_t dimension);

/// The activations of a sequence-parallel region are cut along `dimension` into the group's parts: `x` must have
/// it, and (`whole`: `x` holds the whole sequence) a size the group divides. `what` names the layer for the refusal.
ACCEL_DECL void check_sequence(const region& group, const at::Tensor& x, std::int64_t dimension, bool whole,
                               const std::string& what);

/// The input of a column-parallel layer: the same on every rank forward; its gradient, a partial sum on each rank,
/// all-reduced in backward (Megatron's `copy_to_tensor_model_parallel_region`, DTensor's Replicate input).
struct copy_to_region : torch::autograd::Function<copy_to_region> {
  ACCEL_DECL static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, region& group);
  ACCEL_DECL static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                            torch::autograd::variable_list grads);
};

/// The output of a row-parallel layer: each rank's partial product all-reduced forward; the gradient, the same on
/// every rank, passed through in backward (Megatron's `reduce_from_tensor_model_parallel_region`).
struct reduce_from_region : torch::autograd::Function<reduce_from_region> {
  ACCEL_DECL static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& partial, region& group);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

/// The sequence-sharded input of a sequence-parallel column-parallel layer: all-gathered along the sequence forward
/// (every rank's shard, whole); its gradient, a partial sum of the whole sequence on each rank, reduce-scattered in
/// backward (Megatron's `gather_from_sequence_parallel_region`, DTensor's Shard(1) input made Replicate).
struct gather_from_sequence : torch::autograd::Function<gather_from_sequence> {
  ACCEL_DECL static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& shard,
                                       std::int64_t dimension, region& group);
  ACCEL_DECL static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                            torch::autograd::variable_list grads);
};

/// The output of a sequence-parallel row-parallel layer (or vocabulary-parallel embedding): each rank's partial
/// product of the whole sequence summed and cut along the sequence, each rank keeping its shard (reduce-scatter);
/// the gradient, each rank's shard, all-gathered in backward (Megatron's `reduce_scatter_to_sequence_parallel_region`).
struct reduce_scatter_to_sequence : torch::autograd::Function<reduce_scatter_to_sequence> {
  ACCEL_DECL static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& partial,
                                       std::int64_t dimension, region& group);
  ACCEL_DECL static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                            torch::autograd::variable_list grads);
};

/// A whole-sequence activation the same on every rank (a position embedding's lookup) cut to this rank's shard,
/// without communication; the gradient, each rank's shard, all-gathered in backward so that the replicated weight's
/// gradient is whole on every rank (Megatron's `scatter_to_sequence_parallel_region`).
struct scatter_to_sequence : torch::autograd::Function<scatter_to_sequence> {
  ACCEL_DECL static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& whole,
                                       std::int64_t dimension, region& group);
  ACCEL_DECL static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                            torch::autograd::variable_list grads);
};

/// Megatron's `_VocabParallelCrossEntropy`: the cross-entropy of each row of logits whose vocabulary is split across
/// the group (this rank's columns start at `first`), without gathering them: the rows' maxima (MAX), the target's
/// logit (SUM: only its owner has it) and the sums of exponentials (SUM) all-reduced; backward is local,
/// softmax minus the target's one-hot, on this rank's columns.
struct vocab_parallel_cross_entropy : torch::autograd::Function<vocab_parallel_cross_entropy> {
  ACCEL_DECL static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                                       const at::Tensor& targets, std::int64_t first, region& group);
  ACCEL_DECL static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                            torch::autograd::variable_list grads);
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

/// An Embedding whose output is cut along the sequence (a position embedding under sequence parallelism): its name,
/// its table (replicated) and the sequence's dimension in its output.
struct sequence_cut {
  std::string name;
  at::Tensor weight;
  std::int64_t dimension;
};

/// The split layers of a model, the router of tensor_parallel's forward scope.
class layer_router : public routing::linear_router {
 public:
  /// `group`: the tp group's collectives, rank and size (its counts start at 0).
  ACCEL_DECL explicit layer_router(region group);
  // Its products' reductions point at its group: it stays where it was made (tensor_parallel's, on the heap).
  layer_router(const layer_router&) = delete;
  layer_router& operator=(const layer_router&) = delete;

  [[nodiscard]] ACCEL_DECL std::optional<at::Tensor> route(const at::Tensor& input, const at::Tensor& operand,
                                                           bool transposed, const at::Tensor* bias,
                                                           const routing::product_split* /*split*/) const override;
  [[nodiscard]] ACCEL_DECL std::optional<at::Tensor> route_embedding(const at::Tensor& weight,
                                                                     const at::Tensor& indices) const override;

  void add(layer split_layer) { layers_.push_back(std::move(split_layer)); }
  /// Cuts the output of the Embedding whose table `cut.weight` is along the sequence (sequence_parallel).
  void add(sequence_cut cut) { sequence_cuts_.push_back(std::move(cut)); }
  [[nodiscard]] const std::deque<layer>& layers() const noexcept { return layers_; }
  /// The split layer `parameter` is a split parameter of, or none (replicated).
  [[nodiscard]] ACCEL_DECL const layer* split_of(const at::Tensor& parameter) const noexcept;
  [[nodiscard]] const tensor_parallel_counts& counts() const noexcept { return group_.counts; }
  /// The group, for the parallel cross-entropy.
  [[nodiscard]] region& group() const noexcept { return group_; }
  /// The sum over the group of `gradient`, the gradient of a replicated parameter that saw this rank's sequence
  /// shard only (a sequence_parallel norm's weight): what a parameter's gradient hook returns.
  [[nodiscard]] ACCEL_DECL at::Tensor summed_gradient(const at::Tensor& gradient) const;

 private:
  /// The local product of a split layer, computed by an outer router where one lists its weight (fp8), else plainly.
  ACCEL_DECL at::Tensor compute(const at::Tensor& input, const layer& split_layer, const at::Tensor* bias) const;
  /// A row-parallel layer's (or the vocabulary-parallel embedding's) partial `out` summed over the group: all-reduced,
  /// or with sequence parallelism reduce-scattered along the sequence.
  ACCEL_DECL at::Tensor reduced(const at::Tensor& out, const layer& split_layer) const;
  /// Megatron's vocabulary-parallel embedding: the ids outside this rank's rows look up row 0 and are zeroed, then
  /// the ranks' outputs summed (each id's row comes from its owner alone).
  ACCEL_DECL at::Tensor embed(const at::Tensor& indices, const layer& split_layer) const;
  /// A sequence_parallel Embedding: the whole lookup (the same on every rank), this rank's shard of it kept.
  ACCEL_DECL at::Tensor embed_shard(const at::Tensor& indices, const sequence_cut& cut) const;

  /// The group's in-place max of an amax (fp8's scales of split operands), counted.
  ACCEL_DECL std::function<void(at::Tensor&)> amax_over_group();

  mutable region group_;                   // the autograd functions count into it
  routing::product_split column_product_;  // a column-parallel layer's local product: the output features split
  routing::product_split row_product_;     // a row-parallel layer's: the input features split
  std::deque<layer> layers_;
  std::vector<sequence_cut> sequence_cuts_;
};

}  // namespace detail::tp
}  // namespace accel

#endif  // ACCEL_HAS_LINEAR_ROUTING

#if ACCEL_HEADER_ONLY
#include "impl/layers.ipp"
#endif
