/// \file
/// What ring.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../ring.hpp"

#include <ATen/ATen.h>

#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../../compat.hpp"

namespace accel::detail::cp {

namespace ring_internals {

/// `lse` with -inf (rows no key reaches) made 0, so that exp(scores - lse) is 0 there rather than NaN.
inline at::Tensor finite(const at::Tensor& lse) { return at::where(at::isinf(lse), at::zeros_like(lse), lse); }

/// The scores of float32 queries against float32 keys, scaled, the pairs `allowed` refuses -inf.
inline at::Tensor scores(const at::Tensor& query, const at::Tensor& key, const at::Tensor& allowed, double scale) {
  auto result = at::matmul(query * scale, key.transpose(-2, -1));
  if (allowed.defined()) result.masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  return result;
}

/// The attention of the queries to one part of the keys: its output, normalised within the part, and the part's
/// log-sum-exp per query (-inf where the part holds no key the query may see; its output is then 0).
struct partial {
  at::Tensor output;
  at::Tensor lse;
};

#if ACCEL_HAS_CPU_FLASH_ATTENTION
/// `allowed` as LibTorch's fused kernel takes a mask: 0 where allowed, -inf elsewhere; none where all are.
inline std::optional<at::Tensor> additive(const at::Tensor& allowed) {
  if (!allowed.defined()) return std::nullopt;
  return at::zeros(allowed.sizes(), at::TensorOptions().dtype(at::kFloat).device(allowed.device()))
      .masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
}
#endif

/// One part's attention: LibTorch's fused CPU kernel where it has one (its log-sum-exp of a query that sees no key
/// of the part made -inf: the kernel gives 0), else float32 math.
inline partial attend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                      const at::Tensor& allowed, double scale) {
#if ACCEL_HAS_CPU_FLASH_ATTENTION
  if (query.is_cpu()) {
    auto [output, lse] =
        at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, false, additive(allowed), scale);
    if (allowed.defined()) lse.masked_fill_(allowed.any(-1).logical_not(), -std::numeric_limits<double>::infinity());
    return {std::move(output), std::move(lse)};
  }
#endif
  const auto weights = scores(query, key, allowed, scale);
  auto lse = at::logsumexp(weights, -1);
  return {at::matmul(at::exp(weights - finite(lse).unsqueeze(-1)), value), std::move(lse)};
}

/// `total` and `part` merged by their log-sum-exp: each weighted by its share of the merged normaliser.
inline void merge(partial& total, partial part) {
  if (!total.output.defined()) {
    total = std::move(part);
    return;
  }
  const auto base = finite(at::maximum(total.lse, part.lse));
  const auto merged = base + at::log(at::exp(total.lse - base) + at::exp(part.lse - base));
  const auto reference = finite(merged);
  total.output = total.output * at::exp(total.lse - reference).unsqueeze(-1) +
                 part.output * at::exp(part.lse - reference).unsqueeze(-1);
  total.lse = merged;
}

/// One part's contribution to the gradients (the flash-attention backward, with the whole sequence's output and
/// log-sum-exp, -inf made 0): adds the queries' gradient into `grad_query` and returns the part's keys' and
/// values' gradients [2, ...]. LibTorch's fused CPU kernel where it has one, else float32 math (`delta` =
/// rowsum(grad_output x output)).
inline at::Tensor attend_backward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                  const at::Tensor& allowed, const at::Tensor& grad_output,
                                  [[maybe_unused]] const at::Tensor& output, const at::Tensor& lse,
                                  const at::Tensor& delta, double scale, at::Tensor& grad_query) {
#if ACCEL_HAS_CPU_FLASH_ATTENTION
  if (query.is_cpu()) {
    auto [grad_q, grad_k, grad_v] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        grad_output, query, key, value, output, lse, 0.0, false, additive(allowed), scale);
    grad_query.add_(grad_q);
    return at::stack({grad_k, grad_v});
  }
#endif
  const auto probabilities = at::exp(scores(query, key, allowed, scale) - lse.unsqueeze(-1));
  auto grad_value = at::matmul(probabilities.transpose(-2, -1), grad_output);
  const auto grad_scores = probabilities * (at::matmul(grad_output, value.transpose(-2, -1)) - delta.unsqueeze(-1));
  grad_query.add_(at::matmul(grad_scores, key) * scale);
  return at::stack({at::matmul(grad_scores.transpose(-2, -1), query * scale), grad_value});
}

/// Visits every process's part of the keys and values [2, ...] (`parts`: this process's) as `visit(owner, part)`:
/// gathered at once, or received from the previous process step by step while the current one is visited.
template <class Visit>
void for_each_part(const attention_plan& plan, const at::Tensor& parts, Visit&& visit) {
  auto* group = plan.group;
  if (group == nullptr || group->size == 1) {
    visit(group == nullptr ? 0 : group->rank, parts);
    return;
  }
  if (plan.rotation == cp_comm_strategy::allgather) {
    auto sizes = parts.sizes().vec();
    sizes.insert(sizes.begin(), group->size);
    auto gathered = at::empty(sizes, parts.options());
    auto flat = gathered.view({-1});
    auto mine = parts.view({-1});
    group->all_gather(flat, mine);
    ++group->counts.forward_all_gathers;
    for (int owner = 0; owner < group->size; ++owner) visit(owner, gathered[owner]);
    return;
  }
  auto current = parts;
  for (int step = 0; step < group->size; ++step) {
    const int owner = (group->rank - step + group->size) % group->size;
    at::Tensor next;
    std::function<void()> arrived;
    if (step + 1 < group->size) {
      next = at::empty_like(current);
      arrived = group->exchange(current, next);
      ++group->counts.forward_exchanges;
    }
    visit(owner, current);
    if (arrived) arrived();
    current = next;
  }
}

inline std::int64_t handle_of(ring* group) { return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(group)); }
inline ring* ring_of_handle(std::int64_t handle) { return reinterpret_cast<ring*>(static_cast<std::intptr_t>(handle)); }

}  // namespace ring_internals

attention_plan*& current_scope() noexcept {
  thread_local attention_plan* scope = nullptr;
  return scope;
}

at::Tensor sequence_split::positions(int rank, std::int64_t local_length) const {
  const auto options = at::TensorOptions().dtype(at::kLong);
  if (!balanced) return at::arange(rank * local_length, (rank + 1) * local_length, options);
  const auto chunk = local_length / 2;
  const auto last = 2 * static_cast<std::int64_t>(size) - 1 - rank;
  return at::cat(
      {at::arange(rank * chunk, (rank + 1) * chunk, options), at::arange(last * chunk, (last + 1) * chunk, options)});
}

at::Tensor sequence_split::shard(const at::Tensor& whole, std::int64_t dimension, int rank,
                                 const std::string& what) const {
  if (dimension < 0 || dimension >= whole.dim())
    throw std::invalid_argument("accel::maybe_context_parallel: " + what + " has " + std::to_string(whole.dim()) +
                                " dimensions, so it has no sequence dimension " + std::to_string(dimension) +
                                "; give buffer_seq_dims one dimension per buffer");
  const auto length = whole.size(dimension);
  if (length % parts() != 0) {
    const auto padded = (length + parts() - 1) / parts() * parts();
    throw std::invalid_argument("accel::maybe_context_parallel: " + what + " has " + std::to_string(length) +
                                " positions along dimension " + std::to_string(dimension) + ", which " +
                                (balanced ? "2 x cp = " : "cp = ") + std::to_string(parts()) + " does not divide" +
                                (balanced ? " (causal load balancing cuts the sequence into 2 x cp chunks)" : "") +
                                ": pad the sequences to " + std::to_string(padded) +
                                " positions (and mask the padding with attention_mask::key_padding)");
  }
  return whole.index_select(dimension, positions(rank, length / size).to(whole.device()));
}

at::Tensor mask_rule::allowed(const at::Tensor& query_positions, const at::Tensor& key_positions) const {
  at::Tensor result;
  const auto add = [&result](const at::Tensor& more) { result = result.defined() ? result.logical_and(more) : more; };
  if (causal) add(query_positions.unsqueeze(1).ge(key_positions.unsqueeze(0)).unsqueeze(0).unsqueeze(0));
  if (documents.defined())
    add(documents.index_select(1, query_positions)
            .unsqueeze(2)
            .eq(documents.index_select(1, key_positions).unsqueeze(1))
            .unsqueeze(1));
  if (key_padding.defined()) add(key_padding.index_select(1, key_positions).unsqueeze(1).unsqueeze(1));
  return result;
}

at::Tensor ring_attention::forward(torch::autograd::AutogradContext* ctx, const at::Tensor& query,
                                   const at::Tensor& key, const at::Tensor& value, const attention_plan& plan,
                                   const mask_rule& rule) {
  using namespace ring_internals;
  const int rank = plan.group == nullptr ? 0 : plan.group->rank;
  const auto length = query.size(2);
  const auto positions = [&](int owner) { return plan.split.positions(owner, length).to(query.device()); };
  const auto mine = positions(rank);
  const auto query32 = query.to(at::kFloat).contiguous();
  partial total;
  for_each_part(plan, at::stack({key, value}).to(at::kFloat).contiguous(), [&](int owner, const at::Tensor& part) {
    merge(total, attend(query32, part[0], part[1], rule.allowed(mine, positions(owner)), plan.scale));
  });
  ctx->save_for_backward({query, key, value, total.output, total.lse});
  ctx->saved_data["ring"] = handle_of(plan.group);
  ctx->saved_data["split_size"] = static_cast<std::int64_t>(plan.split.size);
  ctx->saved_data["balanced"] = plan.split.balanced;
  ctx->saved_data["allgather"] = plan.rotation == cp_comm_strategy::allgather;
  ctx->saved_data["scale"] = plan.scale;
  ctx->saved_data["causal"] = rule.causal;
  ctx->saved_data["key_padding"] = rule.key_padding;
  ctx->saved_data["documents"] = rule.documents;
  return total.output.to(query.scalar_type());
}

torch::autograd::variable_list ring_attention::backward(torch::autograd::AutogradContext* ctx,
                                                        torch::autograd::variable_list grads) {
  using namespace ring_internals;
  const auto saved = ctx->get_saved_variables();
  const auto &query = saved[0], &key = saved[1], &value = saved[2], &output = saved[3];
  const attention_plan plan{
      ring_of_handle(ctx->saved_data["ring"].toInt()),
      {static_cast<int>(ctx->saved_data["split_size"].toInt()), ctx->saved_data["balanced"].toBool()},
      ctx->saved_data["allgather"].toBool() ? cp_comm_strategy::allgather : cp_comm_strategy::alltoall,
      ctx->saved_data["scale"].toDouble()};
  const mask_rule rule{ctx->saved_data["causal"].toBool(), ctx->saved_data["key_padding"].toTensor(),
                       ctx->saved_data["documents"].toTensor()};
  auto* group = plan.group;
  const int rank = group == nullptr ? 0 : group->rank;
  const int size = group == nullptr ? 1 : group->size;
  const auto length = query.size(2);
  const auto positions = [&](int owner) { return plan.split.positions(owner, length).to(query.device()); };
  const auto mine = positions(rank);
  const auto query32 = query.to(at::kFloat).contiguous();
  const auto grad_output = grads[0].to(at::kFloat).contiguous();
  const auto delta = (grad_output * output).sum(-1);
  const auto lse = finite(saved[4]);
  auto grad_query = at::zeros_like(query32);
  const auto contribution = [&](int owner, const at::Tensor& part) {
    return attend_backward(query32, part[0], part[1], rule.allowed(mine, positions(owner)), grad_output, output, lse,
                           delta, plan.scale, grad_query);
  };
  const auto parts = at::stack({key, value}).to(at::kFloat).contiguous();
  at::Tensor grad_parts;  // this process's keys' and values' gradients [2, ...]
  if (size == 1) {
    grad_parts = contribution(rank, parts);
  } else if (plan.rotation == cp_comm_strategy::allgather) {
    auto sizes = parts.sizes().vec();
    sizes.insert(sizes.begin(), size);
    auto gathered = at::empty(sizes, parts.options());
    auto flat = gathered.view({-1});
    auto mine_flat = parts.view({-1});
    group->all_gather(flat, mine_flat);
    ++group->counts.backward_all_gathers;
    auto contributions = at::empty_like(gathered);
    for (int owner = 0; owner < size; ++owner) contributions[owner].copy_(contribution(owner, gathered[owner]));
    grad_parts = at::empty_like(parts);
    auto summed = grad_parts.view({-1});
    auto all = contributions.view({-1});
    group->reduce_scatter(summed, all);
    ++group->counts.backward_reduce_scatters;
  } else {
    // The keys and values travel with their gradients' running sums; the last step brings each part home.
    auto travelling = at::cat({parts, at::zeros_like(parts)}).contiguous();
    for (int step = 0; step < size; ++step) {
      const int owner = (rank - step + size) % size;
      travelling.narrow(0, 2, 2).add_(contribution(owner, travelling.narrow(0, 0, 2)));
      auto next = at::empty_like(travelling);
      group->exchange(travelling, next)();
      ++group->counts.backward_exchanges;
      travelling = next;
    }
    grad_parts = travelling.narrow(0, 2, 2);
  }
  return {grad_query.to(query.scalar_type()), grad_parts[0].to(key.scalar_type()),
          grad_parts[1].to(value.scalar_type()), at::Tensor(), at::Tensor()};
}

}  // namespace accel::detail::cp
