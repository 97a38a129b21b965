/// \file
/// What context_parallel.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../context_parallel.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "../collectives.hpp"

namespace accel {

namespace detail::cp::attention_internals {

/// q, k and v as ring attention takes them: 4-D, of one batch, length and head dim; k and v of one shape, their
/// heads dividing the queries' (repeated to match, as grouped-query attention does).
inline void check_shapes(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) {
  const std::string name = "accel::scaled_dot_product_attention: ";
  if (query.dim() != 4 || key.dim() != 4 || value.dim() != 4)
    throw std::invalid_argument(name + "query, key and value must be [batch, heads, length, head dim]; they are " +
                                shape_text(query.sizes()) + ", " + shape_text(key.sizes()) + " and " +
                                shape_text(value.sizes()));
  if (key.sizes() != value.sizes() || key.size(0) != query.size(0) || key.size(2) != query.size(2) ||
      key.size(3) != query.size(3) || query.size(1) % key.size(1) != 0)
    throw std::invalid_argument(name + "query " + shape_text(query.sizes()) + ", key " + shape_text(key.sizes()) +
                                " and value " + shape_text(value.sizes()) +
                                " do not match: self-attention over one sequence needs one batch, length and head "
                                "dim, and key and value of one shape whose heads divide the query's");
  if (!at::isFloatingType(query.scalar_type()) || key.scalar_type() != query.scalar_type() ||
      value.scalar_type() != query.scalar_type())
    throw std::invalid_argument(name + "query, key and value must be of one floating dtype");
}

/// A mask tensor over the whole sequence of `length`, as [batch or 1, length] on `device`.
inline at::Tensor whole_sequence(const at::Tensor& given, std::int64_t length, const c10::Device& device,
                                 const char* what, bool inside_scope) {
  const auto rows = given.dim() == 1 ? given.unsqueeze(0) : given;
  if (rows.dim() != 2 || rows.size(1) != length)
    throw std::invalid_argument(
        std::string("accel::scaled_dot_product_attention: attention_mask::") + what + " is " +
        shape_text(given.sizes()) + "; it must describe the whole sequence of " + std::to_string(length) +
        " positions" +
        (inside_scope ? " (under context parallelism too: leave it out of maybe_context_parallel's buffers)" : ""));
  return rows.to(device);
}

/// Document ids from boundaries: position p belongs to document d where cumulative[d] <= p < cumulative[d + 1].
inline at::Tensor documents_of(const at::Tensor& cumulative, std::int64_t length, const c10::Device& device) {
  const auto bounds = cumulative.to(at::kLong).cpu();
  if (bounds.dim() != 1 || bounds.numel() < 2 || bounds[0].item<std::int64_t>() != 0 ||
      bounds[-1].item<std::int64_t>() != length || (bounds.diff() < 0).any().item<bool>())
    throw std::invalid_argument(
        "accel::scaled_dot_product_attention: attention_mask::cumulative_lengths must rise from 0 to the whole "
        "sequence's length, " +
        std::to_string(length) + "; it is " + shape_text(cumulative.sizes()));
  return (at::searchsorted(bounds, at::arange(length, at::TensorOptions().dtype(at::kLong)), false, true) - 1)
      .unsqueeze(0)
      .to(device);
}

/// Attention in one process, with LibTorch's operations in the tensors' dtype, as a model writes it by hand (and as
/// autocast casts them): scores, masked, softmax (a query no key may reach gets zeros), weighted values.
inline at::Tensor plain_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                  const mask_rule& rule, const at::Tensor& bias, std::optional<double> scale) {
  auto scores = at::matmul(query, key.transpose(-2, -1));
  scores = scale ? scores * *scale : scores / std::sqrt(static_cast<double>(query.size(3)));
  const auto positions = at::arange(query.size(2), at::TensorOptions().dtype(at::kLong).device(query.device()));
  if (const auto allowed = rule.allowed(positions, positions); allowed.defined())
    scores = scores.masked_fill(allowed.logical_not(), -INFINITY);
  if (bias.defined())
    scores = bias.scalar_type() == at::kBool ? scores.masked_fill(bias.logical_not(), -INFINITY) : scores + bias;
  return at::matmul(at::nan_to_num(scores.softmax(-1), 0.0), value);
}

}  // namespace detail::cp::attention_internals

at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                        const attention_mask& mask, std::optional<double> scale) {
  using namespace detail::cp;
  using namespace detail::cp::attention_internals;
  check_shapes(query, key, value);
  const auto* scope = current_scope();
  const int parts = scope == nullptr ? 1 : scope->group->size;
  const auto length = query.size(2) * parts;
  mask_rule rule{mask.is_causal, {}, {}};
  if (mask.key_padding.defined())
    rule.key_padding =
        whole_sequence(mask.key_padding, length, query.device(), "key_padding", scope != nullptr).to(at::kBool);
  if (mask.document_ids.defined() && mask.cumulative_lengths.defined())
    throw std::invalid_argument(
        "accel::scaled_dot_product_attention: attention_mask has both document_ids and cumulative_lengths; give one");
  if (mask.document_ids.defined())
    rule.documents = whole_sequence(mask.document_ids, length, query.device(), "document_ids", scope != nullptr);
  if (mask.cumulative_lengths.defined()) rule.documents = documents_of(mask.cumulative_lengths, length, query.device());
  const auto repeats = query.size(1) / key.size(1);
  const auto keys = repeats == 1 ? key : key.repeat_interleave(repeats, 1);
  const auto values = repeats == 1 ? value : value.repeat_interleave(repeats, 1);
  if (scope == nullptr) return plain_attention(query, keys, values, rule, mask.bias, scale);
  if (mask.bias.defined())
    throw std::invalid_argument(
        "accel::scaled_dot_product_attention: attention_mask::bias under context parallelism: an arbitrary mask or "
        "bias cannot be split along the sequence. Express it as is_causal, key_padding, document_ids or "
        "cumulative_lengths, or compute this attention outside maybe_context_parallel's scope");
  attention_plan plan = *scope;
  plan.scale = scale.value_or(1.0 / std::sqrt(static_cast<double>(query.size(3))));
  return ring_attention::apply(query, keys, values, plan, rule);
}

context_parallel_scope::context_parallel_scope(detail::cp::ring& group, std::vector<at::Tensor> buffers,
                                               const std::vector<std::int64_t>& buffer_seq_dims,
                                               const std::vector<at::Tensor>& no_restore_buffers, bool load_balance,
                                               cp_comm_strategy rotation) {
  const std::string name = "accel::maybe_context_parallel: ";
  if (buffers.size() != buffer_seq_dims.size())
    throw std::invalid_argument(name + std::to_string(buffers.size()) + " buffers and " +
                                std::to_string(buffer_seq_dims.size()) +
                                " sequence dimensions (buffer_seq_dims): give one dimension per buffer");
  for (const auto& kept : no_restore_buffers) {
    bool listed = false;
    for (const auto& buffer : buffers) listed = listed || buffer.is_same(kept);
    if (!listed) throw std::invalid_argument(name + "a tensor of no_restore_buffers is not among the buffers");
  }
  const detail::cp::sequence_split split{group.size, load_balance};
  std::vector<at::Tensor> parts;  // every buffer cut before any changes: a refusal leaves them all whole
  for (std::size_t i = 0; i < buffers.size(); ++i)
    parts.push_back(split.shard(buffers[i], buffer_seq_dims[i], group.rank, "buffer " + std::to_string(i)));
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    bool keep_part = false;
    for (const auto& kept : no_restore_buffers) keep_part = keep_part || buffers[i].is_same(kept);
    if (!keep_part) restore_.push_back({buffers[i], buffers[i].detach()});
    buffers[i].set_(parts[i]);
  }
  scope_ = {&group, split, rotation};
  previous_ = std::exchange(detail::cp::current_scope(), &scope_);
}

context_parallel_scope::~context_parallel_scope() {
  if (!active()) return;
  detail::cp::current_scope() = previous_;
  at::NoGradGuard no_grad;
  for (auto& item : restore_) item.buffer.set_(item.whole);
}

}  // namespace accel
