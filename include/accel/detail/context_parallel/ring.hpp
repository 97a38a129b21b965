/// \file
/// Ring attention, the computation of context parallelism: each process holds a part of the sequence's queries, keys
/// and values; the keys and values travel the "cp" group (all-gathered at once, or passed to the next process step by
/// step) and each process attends its queries to every part in turn, merging the parts' results by their
/// log-sum-exp in float32. Backward computes each part's key and value gradients where its queries are and returns
/// them to the part's owner (a reduce-scatter, or with the part around the ring). The masks are computed from the
/// tokens' places in the whole sequence, so that a causal, padded or packed attention is exact on any split.
// IWYU pragma: private, include <accel/context_parallel.hpp>
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <functional>

#include "../config.hpp"
#include "../../options.hpp"  // cp_comm_strategy

namespace accel {

/// The collectives ring attention ran on this process's "cp" group since the process started. All-gather rotation:
/// forward one all-gather of the keys and values; backward one all-gather of them again and one reduce-scatter of
/// their gradients. All-to-all rotation: forward P - 1 exchanges with the neighbours; backward P (keys, values and
/// their gradients travel together, the last exchange returning each part's gradients to its owner).
struct context_parallel_counts {
  std::int64_t forward_all_gathers = 0;
  std::int64_t forward_exchanges = 0;
  std::int64_t backward_all_gathers = 0;
  std::int64_t backward_reduce_scatters = 0;
  std::int64_t backward_exchanges = 0;
  friend bool operator==(const context_parallel_counts&, const context_parallel_counts&) = default;
};

namespace detail::cp {

/// The "cp" group as ring attention uses it: a flat all-gather and a flat sum reduce-scatter in rank order, and one
/// step of the ring (send to rank + 1, receive from rank - 1; returns what waits for it), with the count of each.
struct ring {
  std::function<void(at::Tensor& output, at::Tensor& input)> all_gather;
  std::function<void(at::Tensor& output, at::Tensor& input)> reduce_scatter;
  std::function<std::function<void()>(at::Tensor& send, at::Tensor& receive)> exchange;
  int rank = 0;
  int size = 1;
  context_parallel_counts counts;
};

/// Where each process's tokens sit in the whole sequence: `size` contiguous parts, or (`balanced`, for causal
/// attention) 2 x `size` chunks of which process r holds r and 2 x size - 1 - r (PyTorch's head-tail load balancer:
/// every process then has as many unmasked query-key pairs).
struct sequence_split {
  int size = 1;
  bool balanced = false;

  /// The number of parts the sequence is cut into (what its length must be a multiple of).
  [[nodiscard]] std::int64_t parts() const noexcept { return balanced ? 2 * size : size; }
  /// The places in the whole sequence of `rank`'s `local_length` tokens, in its local order (int64).
  [[nodiscard]] ACCEL_DECL at::Tensor positions(int rank, std::int64_t local_length) const;
  /// `rank`'s part of `whole` along `dimension`; throws std::invalid_argument, naming `what` and the padding to
  /// use, when the parts do not divide its length.
  [[nodiscard]] ACCEL_DECL at::Tensor shard(const at::Tensor& whole, std::int64_t dimension, int rank,
                                            const std::string& what) const;
};

/// Which query-key pairs attention allows, from the tokens' places in the whole sequence: causal, a key padding
/// mask [batch, length] (true: a real token), document ids [batch or 1, length] (packed documents: a query attends
/// keys of its own document only). Undefined tensors: not used.
struct mask_rule {
  bool causal = false;
  at::Tensor key_padding;
  at::Tensor documents;

  /// Allowed pairs of queries at `query_positions` and keys at `key_positions` (int64, places in the whole
  /// sequence), broadcastable to [batch, heads, queries, keys]; undefined when every pair is allowed.
  [[nodiscard]] ACCEL_DECL at::Tensor allowed(const at::Tensor& query_positions, const at::Tensor& key_positions) const;
};

/// What one call of ring attention runs on: the group (none: one process, nothing communicated), the split, the
/// rotation and the scale of the scores.
struct attention_plan {
  ring* group = nullptr;
  sequence_split split;
  cp_comm_strategy rotation = cp_comm_strategy::allgather;
  double scale = 1.0;
};

/// The plan of the context-parallel scope alive on this thread (maybe_context_parallel), if any: its group, split
/// and rotation (each call of the attention sets its own scale).
ACCEL_DECL attention_plan*& current_scope() noexcept;

/// Attention of q, k, v [batch, heads, local length, head dim] under `plan` and `rule`, as one autograd function:
/// outputs in q's dtype, computed in float32.
struct ring_attention : torch::autograd::Function<ring_attention> {
  ACCEL_DECL static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& query,
                                       const at::Tensor& key, const at::Tensor& value, const attention_plan& plan,
                                       const mask_rule& rule);
  ACCEL_DECL static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                            torch::autograd::variable_list grads);
};

}  // namespace detail::cp
}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/ring.ipp"
#endif
