/// \file
/// Tensor parallelism (Megatron-LM's column- and row-parallel Linear, PyTorch's `parallelize_module` with
/// `ColwiseParallel` and `RowwiseParallel`) on the "tp" dimension of the job's device mesh (device_mesh.hpp), with
/// replicated data parallelism (`data_parallel`) over its "dp" dimension:
///
///     // accel launch --nproc_per_node 4 --parallelism_config_dp_shard_size 2 --parallelism_config_tp_size 2
///     accel::accelerator<accel::fp32, accel::tensor_parallel<accel::gloo>> acc;
///     accel::parallelize_module(acc, model, {{"fc1", accel::colwise_parallel{}}, {"fc2", accel::rowwise_parallel{}}});
///     torch::optim::AdamW optimizer(model->parameters());  // after: its state is built on the local slices
///     auto [m, opt, batches] = acc.prepare(model, optimizer, loader);
///
/// The plan names Linear layers of the model; each one's weight (and a column-parallel layer's bias) is replaced by
/// this rank's slice, the same parameter holding less. The modules stay the user's own: LibTorch modules have no
/// forward hooks, so the forward of a prepared model routes the split layers' calls (detail/support/linear_routing.hpp)
/// through one all-reduce per column/row pair forward and one backward (detail/tensor_parallel/layers.hpp). As with
/// PyTorch's, code that reshapes a column-parallel output (attention heads) uses the local sizes (heads / tp).
/// Sequence parallelism (`.sequence_parallel = true` on the pairs, `sequence_parallel{}` on the norms and dropout
/// between them) turns each all-reduce into an all-gather and a reduce-scatter along the sequence.
#pragma once

#include "detail/config.hpp"
#include "detail/compat.hpp"  // ACCEL_HAS_LINEAR_ROUTING

#include <ATen/ATen.h>

#if ACCEL_HAS_LINEAR_ROUTING
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "detail/prepared/accelerator_access.hpp"
#include "detail/support/optimizer_state.hpp"
#include "detail/support/text.hpp"
#include "detail/tensor_parallel/layers.hpp"
#include "device_mesh.hpp"
#include "parallel.hpp"
#include "prepared_model.hpp"

namespace accel {

/// PyTorch's `ColwiseParallel`: the Linear's output features split across the "tp" group; its input whole on every
/// rank, its output this rank's slice of the features (the next layer, row-parallel, takes it as it is). `fused`:
/// the output is that many equal parts side by side (attention's fused query, key and value: 3), each split across
/// the group, so that this rank's output is its slice of each part, side by side. `sequence_parallel` (PyTorch's
/// `ColwiseParallel(input_layouts=Shard(1))`, Megatron's sequence parallelism): its input is this rank's shard of the
/// sequence along `sequence_dim`, all-gathered before the product (its gradient reduce-scattered in backward).
struct colwise_parallel {
  std::int64_t fused = 1;
  bool sequence_parallel = false;
  std::int64_t sequence_dim = 1;  // of the activations: [batch, sequence, features]
};
/// PyTorch's `RowwiseParallel`: the Linear's input features split across the "tp" group; its input this rank's
/// slice of the features, its output whole on every rank (the partial products all-reduced, then the bias added).
/// On an Embedding (as PyTorch's on an nn.Embedding): its vocabulary split, Megatron's vocabulary-parallel embedding
/// (each id's row looked up by the rank that holds it, the outputs all-reduced). `sequence_parallel` (PyTorch's
/// `RowwiseParallel(output_layouts=Shard(1))`): the partial outputs reduce-scattered along `sequence_dim` instead,
/// each rank keeping its shard of the sequence (all-gathered in backward); a Linear's bias, added to the shard, has
/// its gradient summed over the group.
struct rowwise_parallel {
  bool sequence_parallel = false;
  std::int64_t sequence_dim = 1;
};
/// PyTorch's `SequenceParallel`, Megatron's sequence parallelism between a row-parallel layer's reduce-scatter and a
/// column-parallel layer's all-gather: the module runs on this rank's shard of the sequence (along `sequence_dim`),
/// its parameters replicated. A LayerNorm's weight and bias see only that shard: their gradients are summed over the
/// group in backward. A Dropout runs on the shard as it is (each rank draws the mask of its own positions). An
/// Embedding (learnt positions, looked up whole on every rank): its output cut to this rank's shard, the gradient
/// all-gathered in backward, so that its table's gradient is whole.
struct sequence_parallel {
  std::int64_t sequence_dim = 1;
};
using tensor_parallel_style = std::variant<colwise_parallel, rowwise_parallel, sequence_parallel>;
/// A plan by module name, as the dict of PyTorch's `parallelize_module`: `{{"blocks.0.fc1", colwise_parallel{}}, ...}`.
using tensor_parallel_plan = std::vector<std::pair<std::string, tensor_parallel_style>>;

namespace detail::tp {

/// `mesh` (the job's `ParallelismConfig`) checked for tensor parallelism on `num_processes`: tp above 1, no cp.
ACCEL_DECL const mesh_layout& tensor_parallel_mesh(const std::optional<mesh_layout>& mesh, int num_processes,
                                                   std::string_view policy_name = "accel::tensor_parallel");

/// The module called `name` in `model`; throws naming the model's Linear and Embedding layers when there is none.
ACCEL_DECL torch::nn::Module& module_named(torch::nn::Module& model, const std::string& name);

/// Rank `index` of `size`'s slice of `whole` along `dimension`, cut first into `fused` equal parts, each sliced.
ACCEL_DECL at::Tensor slice_of(const at::Tensor& whole, std::int64_t dimension, std::int64_t fused, int index,
                               int size);

/// The whole tensor of the ranks' `slices` (slice_of's, in rank order).
ACCEL_DECL at::Tensor whole_of(const std::vector<at::Tensor>& slices, std::int64_t dimension, std::int64_t fused);

/// Rank `index` of `size`'s slice of `parameter` along `dimension`, in place (the parameter keeps its identity, so an
/// optimizer built after holds the slice); returns where the slice starts. `what` names the features for a refusal.
ACCEL_DECL std::int64_t keep_slice(const std::string& name, at::Tensor& parameter, std::int64_t dimension, int index,
                                   int size, const std::string& what, std::int64_t fused = 1);

/// The dimension of the activations a column- or row-parallel `style` splits the sequence along; none without
/// sequence parallelism.
ACCEL_DECL std::optional<std::int64_t> sequence_dim_of(const std::string& name, const tensor_parallel_style& style);

/// Refuses an Embedding option that a routed lookup (vocabulary-parallel, or cut along the sequence) would ignore.
ACCEL_DECL void check_plain_embedding(const std::string& name, const torch::nn::EmbeddingImpl& embedding,
                                      const std::string& how_split);

/// The layer called `name` in `model` split as `style` (column- or row-parallel) across `size` ranks, keeping rank
/// `index`'s slice: a Linear column- or row-parallel, an Embedding (row-parallel: PyTorch's RowwiseParallel on an
/// nn.Embedding) by its vocabulary.
ACCEL_DECL layer split_layer(torch::nn::Module& model, const std::string& name, const tensor_parallel_style& style,
                             int index, int size);

/// What `sequence_parallel` does to the module called `name`: the parameters whose gradients the group sums (a
/// LayerNorm's), or the cut of an Embedding's output along the sequence; a Dropout needs neither.
struct sequence_shard_module {
  std::vector<at::Tensor> summed_gradients;
  std::optional<sequence_cut> cut;
};
ACCEL_DECL sequence_shard_module sequence_shard(torch::nn::Module& model, const std::string& name,
                                                const sequence_parallel& style);

/// Tensor parallelism on the "tp" dimension of the job's mesh beside `DataParallelism` on its data-parallel
/// dimensions, what `tensor_parallel` (data_parallel) and `fully_sharded_tensor_parallel` (fully_sharded) share: the
/// split layers and their routing, the job's processes and collectives, and each checkpoint and clipping hook
/// written as the data parallelism's hook composed with the tp group's gather or sum. The policy narrows the data
/// parallelism to its groups. Every process of the job constructs it at the same point (it makes the mesh's groups).
template <class DataParallelism>
struct tensor_parallel_beside : DataParallelism {
  using base = DataParallelism;
  using typename base::communicator_type;
  static constexpr bool joins_uneven_inputs = false;
  static constexpr bool steps_alone = false;  // a rank's optimizer holds slices: local_sgd would average them apart

  tensor_parallel_beside(const options& opts, std::string_view policy)
      : base(opts),
        world_(&base::communicator()),
        mesh_(tensor_parallel_mesh(configured_mesh(opts.parallelism_config, world_->size()), world_->size(), policy)
                  .sizes(),
              *world_),
        tp_group_(&mesh_.group("tp")),
        layers_(std::make_shared<detail::tp::layer_router>(tp_region(*tp_group_))) {
    detail::routing::install_routing();
  }

  // The job's processes and collectives, not the dp group's (which the data parallelism inherited reduces over).
  [[nodiscard]] int process_index() const noexcept { return world_->rank(); }
  [[nodiscard]] int local_process_index() const noexcept { return world_->environment().local_rank; }
  [[nodiscard]] int num_processes() const noexcept { return world_->size(); }
  void wait_for_everyone() { world_->barrier(); }
  [[nodiscard]] communicator_type& communicator() noexcept { return *world_; }
  /// The mesh: its layout and this process's groups.
  [[nodiscard]] const device_mesh<communicator_type>& mesh() const noexcept { return mesh_; }

  /// What `accel::parallelize_module` does: every process of the job takes process 0's weights (the tp peers must
  /// slice the same ones), then each Linear the plan names keeps this rank's slice. Before the optimizer is built.
  /// A `sequence_parallel` entry: a LayerNorm's parameters get their gradients summed over the tp group, an
  /// Embedding's output is cut along the sequence.
  void parallelize_module(torch::nn::Module& model, const tensor_parallel_plan& plan) {
    detail::broadcast_module_state(model, *world_);
    for (const auto& [name, style] : plan) {
      if (const auto* sequence = std::get_if<sequence_parallel>(&style)) {
        auto shard = detail::tp::sequence_shard(model, name, *sequence);
        for (auto& parameter : shard.summed_gradients) sum_gradient_over_tp(parameter);
        if (shard.cut) layers_->add(*std::move(shard.cut));
        continue;
      }
      auto split = detail::tp::split_layer(model, name, style, mesh_.local_rank("tp"), tp_group_->size());
      // Added to this rank's shard of the sequence, a row-parallel layer's bias has a part of its gradient here.
      if (split.sequence_dim && split.kind == detail::tp::split::rows_of_input && split.bias.defined())
        sum_gradient_over_tp(split.bias);
      layers_->add(std::move(split));
    }
  }

  /// Alive around each forward of a prepared model: the split layers computed with their all-reduces.
  [[nodiscard]] routing::routing_scope forward_scope() const { return routing::routing_scope(*layers_); }

  /// The mean cross-entropy of `logits`, split by the vocabulary across the tp group (a column-parallel output layer's
  /// output: this rank's columns, rows = the tokens), against `targets` (ids in the whole vocabulary), as
  /// `torch::nn::functional::cross_entropy` of the whole logits: Megatron's vocabulary-parallel cross-entropy.
  [[nodiscard]] at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets) const {
    const auto first = logits.size(-1) * mesh_.local_rank("tp");
    auto& group = layers_->group();
    return apply_function<tp::vocab_parallel_cross_entropy>(group, logits.reshape({-1, logits.size(-1)}),
                                                            targets.reshape({-1}), first)
        .mean();
  }

  /// The collectives the split layers ran on the tp group so far, each way (all-reduces; with sequence parallelism
  /// all-gathers and reduce-scatters, and the sequence-sharded parameters' gradient all-reduces).
  [[nodiscard]] tensor_parallel_counts all_reduces() const noexcept { return layers_->counts(); }
  /// The names of the split layers, in the plan's order.
  [[nodiscard]] std::vector<std::string> split_layers() const {
    std::vector<std::string> names;
    for (const auto& split_layer : layers_->layers()) names.push_back(split_layer.name);
    return names;
  }

  /// Whether any process found an inf/NaN gradient: the data parallelism's verdict over its group (each process's
  /// shards, or the same all-reduced gradients), then over the tp group, whose split gradients' slices differ.
  [[nodiscard]] bool any_non_finite(bool found_here) {
    const bool found_in_group = base::any_non_finite(found_here);
    auto flag = at::full({1}, found_in_group ? 1.0 : 0.0, at::kFloat);
    tp_group_->all_reduce(flag, reduction::max).wait();
    return flag.item<float>() > 0;
  }
  /// The total gradient norm over the whole model: the data parallelism's norm of the split gradients (over its
  /// group: its shards summed, or the all-reduced gradients) summed over the tp group, and of the others counted
  /// once (the tp peers hold the same).
  [[nodiscard]] double gradient_norm(const std::vector<at::Tensor>& parameters, double norm_type) {
    std::vector<at::Tensor> split_parameters, replicated_parameters;
    for (const auto& parameter : parameters)
      (layers_->split_of(parameter) != nullptr ? split_parameters : replicated_parameters).push_back(parameter);
    const bool infinite = std::isinf(norm_type);
    const double split_norm = base::gradient_norm(split_parameters, norm_type);
    const double replicated = base::gradient_norm(replicated_parameters, norm_type);
    auto split = at::full({1}, infinite ? split_norm : std::pow(split_norm, norm_type), at::kDouble);
    tp_group_->all_reduce(split, infinite ? reduction::max : reduction::sum).wait();
    const double split_part = split.item<double>();
    return infinite ? std::max(split_part, replicated)
                    : std::pow(split_part + std::pow(replicated, norm_type), 1.0 / norm_type);
  }
  /// Scales the gradients this process holds (the data parallelism's: whole, or its shards) so that the whole
  /// model's norm is at most `max_norm` (`clip_grad_norm_`'s rule); returns the norm before.
  double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
    const double total = gradient_norm(parameters, norm_type);
    this->scale_gradients(parameters, std::min(max_norm / (total + 1e-6), 1.0));
    return total;
  }

  /// `parameter` whole (get_state_dict): the data parallelism's full parameter (a sharded one gathered over its
  /// group), then a split one's slices gathered from the tp group.
  [[nodiscard]] at::Tensor full_parameter(const at::Tensor& parameter) {
    auto local = base::full_parameter(parameter);
    const auto* split_layer = layers_->split_of(parameter);
    if (split_layer == nullptr) return local;
    return gathered(local.detach(), *split_layer, local.dim() == 1 ? 0 : split_layer->weight_dimension());
  }
  /// Runs `action` (save_state, load_state) with every parameter full (the data parallelism's) and every split one
  /// whole, gathered over the tp group, keeping what it writes into them: afterwards each split one's slice of what
  /// it then holds is copied back into the tensor it held before, which the data parallelism may keep its shard of.
  /// A collective.
  template <class Action>
  void with_full_parameters(torch::nn::Module& module, Action&& action) {
    base::with_full_parameters(module, [&] {
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> before;
      for_each_split_parameter([&](at::Tensor& parameter, const auto& split_layer, std::int64_t dimension) {
        before.push_back(parameter.data());
        parameter.set_data(gathered(parameter.detach(), split_layer, dimension));
      });
      const auto slice_again = [&] {
        std::size_t i = 0;
        for_each_split_parameter([&](at::Tensor& parameter, const auto& split_layer, std::int64_t dimension) {
          before[i].copy_(sliced(parameter.detach(), split_layer, dimension));
          parameter.set_data(before[i++]);
        });
      };
      try {
        std::forward<Action>(action)();
      } catch (...) {
        slice_again();
        throw;
      }
      slice_again();
    });
  }
  /// `save_state`: runs `write` with the optimizer holding each parameter's full state (the data parallelism's,
  /// gathered from its shards) and each split one's whole, gathered over the tp group. A collective.
  template <class Write>
  void with_full_optimizer_state(torch::optim::Optimizer& optimizer, Write&& write) {
    base::with_full_optimizer_state(optimizer, [&] { with_whole_split_state(optimizer, std::forward<Write>(write)); });
  }
  /// `load_state`: `load()` loads a whole state into the optimizer, each split parameter's state keeps this rank's
  /// slice, then the data parallelism keeps its shard of each. No communication.
  template <class Load>
  void load_full_optimizer_state(torch::optim::Optimizer& optimizer, Load&& load) {
    base::load_full_optimizer_state(optimizer, [&] {
      std::forward<Load>(load)();
      at::NoGradGuard no_grad;
      auto& state = optimizer.state();
      for_each_split_parameter([&](at::Tensor& parameter, const auto& split_layer, std::int64_t dimension) {
        auto found = state.find(detail::compat::optimizer_state_key(parameter));
        if (found == state.end()) return;
        check_elementwise(detail::transform_state_tensors(
            *found->second, [&](const at::Tensor& whole) { return sliced(whole, split_layer, dimension); }));
      });
    });
  }

 protected:
  [[nodiscard]] communicator_type& world() noexcept { return *world_; }

 private:
  /// Runs `write` with the optimizer holding each split parameter's whole state, gathered over the tp group (its
  /// slices kept aside and put back after).
  template <class Write>
  void with_whole_split_state(torch::optim::Optimizer& optimizer, Write&& write) {
    at::NoGradGuard no_grad;
    auto& state = optimizer.state();
    std::vector<std::pair<at::Tensor, std::unique_ptr<torch::optim::OptimizerParamState>>> kept;
    const auto restore = [&] {
      for (auto& [parameter, slices] : kept) state[detail::compat::optimizer_state_key(parameter)] = std::move(slices);
    };
    try {
      for_each_split_parameter([&](at::Tensor& parameter, const auto& split_layer, std::int64_t dimension) {
        auto found = state.find(detail::compat::optimizer_state_key(parameter));
        if (found == state.end()) return;
        auto whole = found->second->clone();
        check_elementwise(detail::transform_state_tensors(
            *whole, [&](const at::Tensor& piece) { return gathered(piece, split_layer, dimension); }));
        kept.emplace_back(parameter, std::exchange(found->second, std::move(whole)));
      });
      std::forward<Write>(write)();
    } catch (...) {
      restore();
      throw;
    }
    restore();
  }

  /// The tp group as the split layers' autograd functions use it.
  static detail::tp::region tp_region(communicator_type& group) {
    detail::tp::region region;
    region.all_reduce = [&group](at::Tensor& tensor, reduction op) { group.all_reduce(tensor, op).wait(); };
    region.all_gather = [&group](at::Tensor& output, at::Tensor& input) {
      group.all_gather_into(output, input).wait();
    };
    region.reduce_scatter = [&group](at::Tensor& output, at::Tensor& input) {
      group.reduce_scatter_into(output, input).wait();
    };
    region.rank = group.rank();
    region.size = group.size();
    return region;
  }
  /// `parameter`, replicated, sees this rank's shard of the sequence only: each backward's gradient is summed over
  /// the tp group before it is accumulated (and before data parallelism's reducer takes it).
  void sum_gradient_over_tp(const at::Tensor& parameter) {
    parameter.register_hook(
        [router = layers_](const at::Tensor& gradient) { return router->summed_gradient(gradient); });
  }

  /// Calls `visit(parameter, layer, dimension)` for each split parameter (a layer's weight; a column-parallel
  /// layer's bias), with the dimension it is split along.
  template <class Visit>
  void for_each_split_parameter(Visit&& visit) const {
    for (const auto& split_layer : layers_->layers()) {
      auto weight = split_layer.weight;  // the same parameter (a handle of its tensor)
      visit(weight, split_layer, split_layer.weight_dimension());
      if (split_layer.kind == detail::tp::split::columns_of_output && split_layer.bias.defined()) {
        auto bias = split_layer.bias;
        visit(bias, split_layer, std::int64_t{0});
      }
    }
  }
  /// The whole of this rank's `slice` of `split_layer`'s parameter (or state), gathered over the tp group. A
  /// collective.
  at::Tensor gathered(const at::Tensor& slice, const detail::tp::layer& split_layer, std::int64_t dimension) {
    return detail::tp::whole_of(tp_group_->all_gather(slice.contiguous()), dimension, split_layer.fused);
  }
  /// This rank's slice of `whole`, a parameter (or state) of `split_layer`.
  at::Tensor sliced(const at::Tensor& whole, const detail::tp::layer& split_layer, std::int64_t dimension) const {
    return detail::tp::slice_of(whole, dimension, split_layer.fused, mesh_.local_rank("tp"), tp_group_->size());
  }
  static void check_elementwise(bool elementwise) {
    if (!elementwise)
      throw std::invalid_argument(
          "accel::tensor_parallel: this optimizer's parameter state is not one of LibTorch's elementwise optimizers' "
          "(Adam, AdamW, SGD, RMSprop, Adagrad), so its split parameters' state cannot be gathered or sliced");
  }

  communicator_type* world_;
  device_mesh<communicator_type> mesh_;
  communicator_type* tp_group_;
  std::shared_ptr<detail::tp::layer_router> layers_;  // on the heap: routing scopes and autograd point into it
};

}  // namespace detail::tp

/// Tensor parallelism over `Backend` on the mesh of the job's `ParallelismConfig` (tp above 1, no cp): the layers
/// a plan names split across the "tp" group (`accel::parallelize_module`), and `data_parallel` over the "dp"
/// group (dp_replicate x dp_shard; replicated: each dp rank holds its tp slices whole, the bytes of DDP, not FSDP's:
/// `accel::fully_sharded_tensor_parallel` shards them over dp_shard, as Accelerate's FSDP2 does).
/// The processes and every query and collective of accel/collectives.hpp are the whole job's; prepared data is
/// sharded by the dp rank, so the tp peers read the same batches (as Accelerate's loader). Every process of the job
/// constructs it at the same point (it makes the mesh's groups).
template <class Backend>
struct tensor_parallel : detail::tp::tensor_parallel_beside<data_parallel<Backend>> {
  explicit tensor_parallel(const options& opts)
      : detail::tp::tensor_parallel_beside<data_parallel<Backend>>(opts, "accel::tensor_parallel") {
    // Gradients are averaged over every process that reads other tokens: the data-parallel ranks and the cp peers.
    const auto& mesh = this->mesh();
    this->narrow_to(mesh.layout().has("dp_cp")
                        ? mesh.group("dp_cp")
                        : detail::mesh_group(this->world(), "dp", std::vector<int>{this->world().rank()}));
  }

  [[nodiscard]] static std::string name() { return "tensor_parallel<" + std::string(Backend::name) + ">"; }
};

/// Megatron's vocabulary-parallel cross-entropy under `accel::tensor_parallel` (its `vocab_parallel_cross_entropy`):
/// the mean cross-entropy of logits split by the vocabulary across the tp group, without gathering them.
template <class Accelerator>
[[nodiscard]] at::Tensor vocab_parallel_cross_entropy(const Accelerator& acc, const at::Tensor& logits,
                                                      const at::Tensor& targets) {
  return acc.parallel().vocab_parallel_cross_entropy(logits, targets);
}

/// PyTorch's `parallelize_module(model, mesh["tp"], plan)`: under `accel::tensor_parallel`, each Linear that `plan`
/// names keeps this rank's slice of its weight (see tensor_parallel.hpp). Call it on every process, before the
/// optimizer is built (so that its state is made on the slices) and before `prepare`.
template <class Accelerator, model_like Model>
void parallelize_module(Accelerator& acc, const Model& model, const tensor_parallel_plan& plan) {
  detail::accelerator_access::parallel(acc).parallelize_module(*detail::module_pointer(model), plan);
}

}  // namespace accel

#else  // a LibTorch without the routing key

#include "detail/support/diagnostics.hpp"

namespace accel {
/// Refused at compile time: this LibTorch has no dispatch key to route the split layers through.
template <class Backend>
struct tensor_parallel {
  static_assert(detail::always_false<Backend>,
                "accel::tensor_parallel routes Linear layers through LibTorch's AutocastPrivateUse1 dispatch key, "
                "which LibTorch 2.4 and later have: build with a newer LibTorch");
};
}  // namespace accel

#endif  // ACCEL_HAS_LINEAR_ROUTING

#if ACCEL_HEADER_ONLY
#include "impl/tensor_parallel.ipp"
#endif
