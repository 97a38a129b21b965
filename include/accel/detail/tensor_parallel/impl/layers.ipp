/// \file
/// What layers.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../layers.hpp"

#if ACCEL_HAS_LINEAR_ROUTING

namespace accel::detail::tp {

bool layer::splits(const at::Tensor& parameter) const noexcept {
  const auto* impl = parameter.unsafeGetTensorImpl();
  return impl == weight.unsafeGetTensorImpl() ||
         (kind == split::columns_of_output && bias.defined() && impl == bias.unsafeGetTensorImpl());
}

region& region_of(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<region*>(static_cast<std::intptr_t>(ctx->saved_data["region"].toInt()));
}

at::Tensor all_gather_along(region& group, const at::Tensor& x, std::int64_t dimension) {
  auto input = leading(x, dimension);
  auto sizes = input.sizes().vec();
  sizes[0] *= group.size;
  auto output = at::empty(sizes, input.options());
  group.all_gather(output, input);
  return put_back(output, dimension);
}

at::Tensor reduce_scatter_along(region& group, const at::Tensor& x, std::int64_t dimension) {
  auto input = leading(x, dimension);
  auto sizes = input.sizes().vec();
  sizes[0] /= group.size;
  auto output = at::empty(sizes, input.options());
  group.reduce_scatter(output, input);
  return put_back(output, dimension);
}

void check_sequence(const region& group, const at::Tensor& x, std::int64_t dimension, bool whole,
                    const std::string& what) {
  const auto shape = c10::str(x.sizes());
  if (x.dim() <= dimension)
    throw std::invalid_argument("accel::tensor_parallel: " + what + " splits the sequence along dimension " +
                                std::to_string(dimension) + ", which its activation " + shape +
                                " lacks; set the style's sequence_dim to the sequence's dimension");
  if (whole && x.size(dimension) % group.size != 0)
    throw std::invalid_argument("accel::tensor_parallel: " + what + " cuts the sequence (dimension " +
                                std::to_string(dimension) + " of " + shape + ", " + std::to_string(x.size(dimension)) +
                                " long) into tp = " + std::to_string(group.size) +
                                " parts, which do not divide it; use a sequence length that tp divides (pad the "
                                "batches), or leave sequence parallelism off");
}

at::Tensor copy_to_region::forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, region& group) {
  ctx->saved_data["region"] = handle_of(group);
  return x.clone();  // an output of its own: autograd then needs no view bookkeeping
}

torch::autograd::variable_list copy_to_region::backward(torch::autograd::AutogradContext* ctx,
                                                        torch::autograd::variable_list grads) {
  auto& group = region_of(ctx);
  auto summed = grads[0].contiguous().clone();
  group.all_reduce(summed, reduction::sum);
  ++group.counts.backward_all_reduces;
  return {summed, at::Tensor()};
}

at::Tensor reduce_from_region::forward(torch::autograd::AutogradContext*, const at::Tensor& partial, region& group) {
  auto summed = partial.contiguous().clone();
  group.all_reduce(summed, reduction::sum);
  ++group.counts.forward_all_reduces;
  return summed;
}

at::Tensor gather_from_sequence::forward(torch::autograd::AutogradContext* ctx, const at::Tensor& shard,
                                         std::int64_t dimension, region& group) {
  ctx->saved_data["region"] = handle_of(group);
  ctx->saved_data["dimension"] = dimension;
  ++group.counts.forward_all_gathers;
  return all_gather_along(group, shard, dimension);
}

torch::autograd::variable_list gather_from_sequence::backward(torch::autograd::AutogradContext* ctx,
                                                              torch::autograd::variable_list grads) {
  auto& group = region_of(ctx);
  ++group.counts.backward_reduce_scatters;
  return {reduce_scatter_along(group, grads[0], ctx->saved_data["dimension"].toInt()), at::Tensor(), at::Tensor()};
}

at::Tensor reduce_scatter_to_sequence::forward(torch::autograd::AutogradContext* ctx, const at::Tensor& partial,
                                               std::int64_t dimension, region& group) {
  ctx->saved_data["region"] = handle_of(group);
  ctx->saved_data["dimension"] = dimension;
  ++group.counts.forward_reduce_scatters;
  return reduce_scatter_along(group, partial, dimension);
}

torch::autograd::variable_list reduce_scatter_to_sequence::backward(torch::autograd::AutogradContext* ctx,
                                                                    torch::autograd::variable_list grads) {
  auto& group = region_of(ctx);
  ++group.counts.backward_all_gathers;
  return {all_gather_along(group, grads[0], ctx->saved_data["dimension"].toInt()), at::Tensor(), at::Tensor()};
}

at::Tensor scatter_to_sequence::forward(torch::autograd::AutogradContext* ctx, const at::Tensor& whole,
                                        std::int64_t dimension, region& group) {
  ctx->saved_data["region"] = handle_of(group);
  ctx->saved_data["dimension"] = dimension;
  const auto part = whole.size(dimension) / group.size;
  return whole.narrow(dimension, group.rank * part, part).clone(at::MemoryFormat::Contiguous);
}

torch::autograd::variable_list scatter_to_sequence::backward(torch::autograd::AutogradContext* ctx,
                                                             torch::autograd::variable_list grads) {
  auto& group = region_of(ctx);
  ++group.counts.backward_all_gathers;
  return {all_gather_along(group, grads[0], ctx->saved_data["dimension"].toInt()), at::Tensor(), at::Tensor()};
}

at::Tensor vocab_parallel_cross_entropy::forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                                                 const at::Tensor& targets, std::int64_t first, region& group) {
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

torch::autograd::variable_list vocab_parallel_cross_entropy::backward(torch::autograd::AutogradContext* ctx,
                                                                      torch::autograd::variable_list grads) {
  const auto saved = ctx->get_saved_variables();
  const auto &softmax = saved[0], &column = saved[1], &outside = saved[2];
  const auto owned = outside.logical_not().to(softmax.scalar_type()).unsqueeze(-1);
  auto grad = softmax.scatter_add(-1, column.unsqueeze(-1), -owned);
  return {grad * grads[0].unsqueeze(-1), at::Tensor(), at::Tensor(), at::Tensor()};
}

layer_router::layer_router(region group)
    : group_(std::move(group)),
      column_product_{routing::product_split::dimension::output_features, amax_over_group()},
      row_product_{routing::product_split::dimension::input_features, amax_over_group()} {}

std::optional<at::Tensor> layer_router::route(const at::Tensor& input, const at::Tensor& operand, bool transposed,
                                              const at::Tensor* bias, const routing::product_split*) const {
  for (const auto& split_layer : layers_)
    if (split_layer.kind != split::vocabulary && routing::is_weight(operand, split_layer.weight, transposed))
      return compute(input, split_layer, bias);
  return std::nullopt;
}

std::optional<at::Tensor> layer_router::route_embedding(const at::Tensor& weight, const at::Tensor& indices) const {
  for (const auto& split_layer : layers_)
    if (split_layer.kind == split::vocabulary && routing::is_weight(weight, split_layer.weight, false))
      return embed(indices, split_layer);
  for (const auto& cut : sequence_cuts_)
    if (routing::is_weight(weight, cut.weight, false)) return embed_shard(indices, cut);
  return std::nullopt;
}

const layer* layer_router::split_of(const at::Tensor& parameter) const noexcept {
  for (const auto& split_layer : layers_)
    if (split_layer.splits(parameter)) return &split_layer;
  return nullptr;
}

at::Tensor layer_router::summed_gradient(const at::Tensor& gradient) const {
  auto summed = gradient.contiguous().clone();
  group_.all_reduce(summed, reduction::sum);
  ++group_.counts.gradient_all_reduces;
  return summed;
}

at::Tensor layer_router::compute(const at::Tensor& input, const layer& split_layer, const at::Tensor* bias) const {
  const auto& sequence = split_layer.sequence_dim;
  if (split_layer.kind == split::columns_of_output) {
    if (sequence) check_sequence(group_, input, *sequence, false, "\"" + split_layer.name + "\"");
    const auto whole = sequence ? apply_function<gather_from_sequence>(group_, input, *sequence)
                                : apply_function<copy_to_region>(group_, input);
    return routing::linear_outside(*this, whole, split_layer.weight, bias, column_product_);
  }
  auto out = reduced(routing::linear_outside(*this, input, split_layer.weight, nullptr, row_product_), split_layer);
  // Once, after the sum, in the output's type: the partial products' (bfloat16 under autocast), as a whole
  // layer's addmm gives; a float32 bias would promote the output.
  return bias != nullptr ? out + bias->to(out.scalar_type()) : out;
}

at::Tensor layer_router::reduced(const at::Tensor& out, const layer& split_layer) const {
  if (!split_layer.sequence_dim) return apply_function<reduce_from_region>(group_, out);
  check_sequence(group_, out, *split_layer.sequence_dim, true, "\"" + split_layer.name + "\"");
  return apply_function<reduce_scatter_to_sequence>(group_, out, *split_layer.sequence_dim);
}

at::Tensor layer_router::embed(const at::Tensor& indices, const layer& split_layer) const {
  const auto local = indices - split_layer.first;
  const auto outside = local.lt(0).logical_or(local.ge(split_layer.weight.size(0)));
  const auto rows = at::embedding(split_layer.weight, local.masked_fill(outside, 0));
  return reduced(rows.masked_fill(outside.unsqueeze(-1), 0), split_layer);
}

at::Tensor layer_router::embed_shard(const at::Tensor& indices, const sequence_cut& cut) const {
  const auto whole = at::embedding(cut.weight, indices);
  check_sequence(group_, whole, cut.dimension, true, "\"" + cut.name + "\"");
  return apply_function<scatter_to_sequence>(group_, whole, cut.dimension);
}

std::function<void(at::Tensor&)> layer_router::amax_over_group() {
  return [this](at::Tensor& amax) {
    auto flat = amax.view({-1});  // a scalar amax as a tensor of one element: the collective's shape
    group_.all_reduce(flat, reduction::max);
    ++group_.counts.amax_all_reduces;
  };
}

}  // namespace accel::detail::tp

#endif  // ACCEL_HAS_LINEAR_ROUTING
