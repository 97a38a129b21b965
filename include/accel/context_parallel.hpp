/// \file
/// Context parallelism: long sequences split across the mesh's "cp" group (Accelerate's `cp_size` and
/// `maybe_context_parallel`, PyTorch's `context_parallel`). Inside the scope, the buffers given are cut along their
/// sequence dimension, each process keeping its part, and `accel::scaled_dot_product_attention` computes ring
/// attention over the group: exact full attention, each process holding only its part of the activations.
///
///     accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc{
///         {.parallelism_config = {.cp_size = 2}}};
///     for (auto&& [tokens, labels] : batches) {
///       auto cp = accel::maybe_context_parallel(acc, {tokens, labels}, {1, 1});  // now this process's part
///       acc.backward(loss(model(tokens), labels));  // the model calls accel::scaled_dot_product_attention
///     }                                              // tokens and labels whole again
///
/// The masks accel can split are declared (`attention_mask`): causal (with head-tail load balancing: the sequence's
/// 2 x cp chunks dealt so that every process computes as much), key padding, and packed documents. Any other mask or
/// bias is refused under context parallelism, never computed wrongly. Rotations (`cp_comm_strategy`): all-gather,
/// PyTorch's default, or one part to the next process per step. Gloo only: NCCL's communicator has no mesh groups.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "detail/config.hpp"
#include "detail/context_parallel/ring.hpp"
#include "detail/context_parallel/ring_for.hpp"
#include "detail/prepared/accelerator_access.hpp"
#include "device_mesh.hpp"
#include "options.hpp"

namespace accel {

/// Which keys each query may attend, in the forms context parallelism can split. Each tensor describes the whole
/// sequence, in its order (under context parallelism too: leave these out of maybe_context_parallel's buffers).
struct attention_mask {
  /// A query attends no key after it.
  bool is_causal = false;
  /// [batch, length] bool: true where the key is a real token, false where it is padding.
  at::Tensor key_padding = {};
  /// [batch, length] or [length] integers: packed documents; a query attends keys of its own document only.
  at::Tensor document_ids = {};
  /// [documents + 1] integers from 0 to the length (flash-attention's cu_seqlens): the same, as boundaries.
  at::Tensor cumulative_lengths = {};
  /// Any other mask (bool, true: allowed) or additive bias, broadcastable to [batch, heads, length, length]: one
  /// process only (refused under context parallelism, which cannot split what it does not know).
  at::Tensor bias = {};
};

/// Attention of `query`, `key` and `value` [batch, heads, length, head dim] (key and value may have fewer heads,
/// dividing the queries': grouped-query attention), scores scaled by `scale` (default: divided by sqrt(head dim))
/// and masked by `mask`. Inside a context-parallel scope the tensors hold this process's part of the sequence and
/// the attention spans the whole sequence (ring attention, computed in float32, returned in the query's dtype);
/// elsewhere it is LibTorch's operations in the tensors' dtype (matmul, masked_fill, softmax, matmul), as a model
/// writes attention by hand. A query no key may reach gets zeros. Throws std::invalid_argument naming a shape, a
/// mask that does not match the sequence, or a `bias` under context parallelism.
[[nodiscard]] ACCEL_DECL at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key,
                                                                 const at::Tensor& value,
                                                                 const attention_mask& mask = {},
                                                                 std::optional<double> scale = std::nullopt);

/// What maybe_context_parallel returns: while alive, the buffers hold this process's part of their sequence and
/// attention spans the cp group; at its end they are whole again (except those it was told not to restore).
class context_parallel_scope {
 public:
  /// No context parallelism (cp = 1): nothing is cut.
  context_parallel_scope() = default;
  /// Cuts each buffer along its `buffer_seq_dims` entry (checked before any is cut: a length that the parts do not
  /// divide is refused with the padding to use, and nothing changes).
  ACCEL_DECL context_parallel_scope(detail::cp::ring& group, std::vector<at::Tensor> buffers,
                                    const std::vector<std::int64_t>& buffer_seq_dims,
                                    const std::vector<at::Tensor>& no_restore_buffers, bool load_balance,
                                    cp_comm_strategy rotation);
  ACCEL_DECL ~context_parallel_scope();
  context_parallel_scope(const context_parallel_scope&) = delete;
  context_parallel_scope& operator=(const context_parallel_scope&) = delete;

  /// Whether the sequence is split (cp above 1).
  [[nodiscard]] bool active() const noexcept { return scope_.group != nullptr; }
  /// The collectives attention ran on this process's cp group since the process started (zeros when inactive).
  [[nodiscard]] context_parallel_counts counts() const {
    return active() ? scope_.group->counts : context_parallel_counts{};
  }

 private:
  struct restored {
    at::Tensor buffer;
    at::Tensor whole;
  };
  detail::cp::attention_plan scope_;
  detail::cp::attention_plan* previous_ = nullptr;
  std::vector<restored> restore_;
};

/// Accelerate's `maybe_context_parallel(buffers, buffer_seq_dims, no_restore_buffers)`: on a mesh with cp above 1,
/// a scope in which each of `buffers` (the same batch on every process of the cp group, as prepared data is) holds
/// this process's part along its `buffer_seq_dims` entry, cut for causal load balancing, and
/// `accel::scaled_dot_product_attention` spans the group; otherwise a scope that does nothing. Make one per step,
/// around the forward and the backward, on every process of the group.
template <class Accelerator>
[[nodiscard]] context_parallel_scope maybe_context_parallel(Accelerator& acc, std::vector<at::Tensor> buffers = {},
                                                            const std::vector<std::int64_t>& buffer_seq_dims = {},
                                                            const std::vector<at::Tensor>& no_restore_buffers = {}) {
  const auto& mesh = acc.parallelism_config();
  if (!mesh || mesh->sizes().cp == 1) return context_parallel_scope();
  auto& group = detail::cp::ring_for(detail::accelerator_access::parallel(acc).communicator(), *mesh);
  return context_parallel_scope(group, std::move(buffers), buffer_seq_dims, no_restore_buffers, /*load_balance=*/true,
                                configured_cp_comm_strategy(acc.options().parallelism_config));
}

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/context_parallel.ipp"
#endif
