/// \file
/// What tensor_parallel.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../tensor_parallel.hpp"

#if ACCEL_HAS_LINEAR_ROUTING

namespace accel::detail::tp {

const mesh_layout& tensor_parallel_mesh(const std::optional<mesh_layout>& mesh, int num_processes,
                                        std::string_view policy_name) {
  const std::string policy = std::string(policy_name) + ": ";
  if (!mesh || mesh->sizes().tp < 2)
    throw mesh_error(policy + "the mesh has no tp dimension (tp must be above 1) for this job of " +
                     std::to_string(num_processes) +
                     " processes: start it with accel launch --parallelism_config_tp_size T (and, for data "
                     "parallelism beside, --parallelism_config_dp_shard_size D, D x T = the processes), or set "
                     "PARALLELISM_CONFIG_TP_SIZE; with tp = 1 use accel::data_parallel");
  return *mesh;
}

torch::nn::Module& module_named(torch::nn::Module& model, const std::string& name) {
  std::string layers;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (item.key() == name) return *item.value();
    if (dynamic_cast<torch::nn::LinearImpl*>(item.value().get()) != nullptr ||
        dynamic_cast<torch::nn::EmbeddingImpl*>(item.value().get()) != nullptr)
      append_item(layers, item.key());
  }
  throw std::invalid_argument("accel::parallelize_module: the model has no module \"" + name +
                              "\"; its Linear and Embedding layers are " +
                              (layers.empty() ? std::string("none") : layers));
}

at::Tensor slice_of(const at::Tensor& whole, std::int64_t dimension, std::int64_t fused, int index, int size) {
  const auto part = whole.size(dimension) / fused / size;
  return whole.unflatten(dimension, {fused, whole.size(dimension) / fused})
      .narrow(dimension + 1, index * part, part)
      .flatten(dimension, dimension + 1)
      .clone();
}

at::Tensor whole_of(const std::vector<at::Tensor>& slices, std::int64_t dimension, std::int64_t fused) {
  std::vector<at::Tensor> parts;
  for (const auto& slice : slices) parts.push_back(slice.unflatten(dimension, {fused, slice.size(dimension) / fused}));
  return at::cat(parts, dimension + 1).flatten(dimension, dimension + 1);
}

std::int64_t keep_slice(const std::string& name, at::Tensor& parameter, std::int64_t dimension, int index, int size,
                        const std::string& what, std::int64_t fused) {
  const auto full = parameter.size(dimension);
  if (fused < 1 || full % fused != 0)
    throw std::invalid_argument("accel::parallelize_module: \"" + name + "\" has " + std::to_string(full) + " " + what +
                                ", which colwise_parallel{.fused = " + std::to_string(fused) +
                                "} cannot cut into equal parts; fused counts the parts side by side in its output");
  if ((full / fused) % size != 0 && fused == 1)
    throw std::invalid_argument("accel::parallelize_module: \"" + name + "\" has " + std::to_string(full) + " " + what +
                                ", which tp = " + std::to_string(size) +
                                " does not divide; choose a tp size that divides them, or leave the layer whole");
  if ((full / fused) % size != 0)  // each fused part is split: it is the part that tp must divide
    throw std::invalid_argument("accel::parallelize_module: \"" + name + "\" has " + std::to_string(full) + " " + what +
                                " in " + std::to_string(fused) + " fused parts of " + std::to_string(full / fused) +
                                ", which tp = " + std::to_string(size) +
                                " does not divide; choose a tp size that divides each part, or leave the layer whole");
  at::NoGradGuard no_grad;
  parameter.set_data(slice_of(parameter, dimension, fused, index, size));
  return index * full / size;
}

std::optional<std::int64_t> sequence_dim_of(const std::string& name, const tensor_parallel_style& style) {
  const auto dimension = std::visit(
      [](const auto& how) -> std::optional<std::int64_t> {
        if constexpr (requires { how.sequence_parallel; })
          if (!how.sequence_parallel) return std::nullopt;
        return how.sequence_dim;
      },
      style);
  if (dimension && *dimension < 0)
    throw std::invalid_argument("accel::parallelize_module: \"" + name + "\" has sequence_dim " +
                                std::to_string(*dimension) +
                                "; it counts the activations' dimensions from 0 (1 for [batch, sequence, features])");
  return dimension;
}

void check_plain_embedding(const std::string& name, const torch::nn::EmbeddingImpl& embedding,
                           const std::string& how_split) {
  const auto& how = embedding.options;
  if (how.padding_idx() || how.max_norm() || how.scale_grad_by_freq() || how.sparse())
    throw std::invalid_argument("accel::parallelize_module: \"" + name + "\" is an Embedding: it " + how_split +
                                " without padding_idx, max_norm, scale_grad_by_freq or sparse");
}

layer split_layer(torch::nn::Module& model, const std::string& name, const tensor_parallel_style& style, int index,
                  int size) {
  auto& module = module_named(model, name);
  const bool colwise = std::holds_alternative<colwise_parallel>(style);
  const auto sequence = sequence_dim_of(name, style);
  if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(&module)) {
    if (!colwise)
      return {name,
              linear->weight,
              linear->bias,
              split::rows_of_input,
              keep_slice(name, linear->weight, 1, index, size, "input features"),
              1,
              sequence};
    const auto fused = std::get<colwise_parallel>(style).fused;
    const auto first = keep_slice(name, linear->weight, 0, index, size, "output features", fused);
    if (linear->bias.defined()) keep_slice(name, linear->bias, 0, index, size, "output features", fused);
    return {name, linear->weight, linear->bias, split::columns_of_output, first, fused, sequence};
  }
  auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(&module);
  if (embedding == nullptr)
    throw std::invalid_argument("accel::parallelize_module: \"" + name + "\" is a " + module.name() +
                                "; colwise_parallel and rowwise_parallel split torch::nn::Linear layers, and "
                                "rowwise_parallel torch::nn::Embedding layers");
  if (colwise)
    throw std::invalid_argument("accel::parallelize_module: \"" + name +
                                "\" is an Embedding: it splits by its vocabulary with rowwise_parallel (as PyTorch's "
                                "RowwiseParallel on an nn.Embedding)");
  check_plain_embedding(name, *embedding, "splits by its vocabulary with rowwise_parallel");
  return {name,
          embedding->weight,
          at::Tensor(),
          split::vocabulary,
          keep_slice(name, embedding->weight, 0, index, size, "rows (its vocabulary)"),
          1,
          sequence};
}

sequence_shard_module sequence_shard(torch::nn::Module& model, const std::string& name,
                                     const sequence_parallel& style) {
  auto& module = module_named(model, name);
  const auto dimension = *sequence_dim_of(name, style);
  if (dynamic_cast<torch::nn::LayerNormImpl*>(&module) != nullptr) return {module.parameters(), std::nullopt};
  if (dynamic_cast<torch::nn::DropoutImpl*>(&module) != nullptr) return {};
  if (auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) {
    check_plain_embedding(name, *embedding, "is cut along the sequence with sequence_parallel");
    return {{}, sequence_cut{name, embedding->weight, dimension}};
  }
  throw std::invalid_argument("accel::parallelize_module: \"" + name + "\" is a " + module.name() +
                              "; sequence_parallel runs torch::nn::LayerNorm and torch::nn::Dropout layers on a "
                              "shard of the sequence, and cuts a torch::nn::Embedding's (learnt positions') output");
}

}  // namespace accel::detail::tp

#endif  // ACCEL_HAS_LINEAR_ROUTING
