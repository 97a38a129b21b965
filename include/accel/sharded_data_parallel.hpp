/// \file
/// Sharded data parallelism (ZeRO): data parallelism whose processes split what every `data_parallel` process holds
/// whole. Three policies on one building block (`detail::sharded_optimizer`: the optimizer re-pointed onto this
/// process's shards, the steps' checks across processes, the full state for checkpoints):
///
/// - `accel::zero1<Backend>` shards the optimizer state: gradients are all-reduced as under `data_parallel`, each
///   process steps its shard of every parameter (its optimizer allocates state for that shard only), and an
///   all-gather per bucket makes the parameters full again. With AdamW that brings the optimizer state from 8 bytes
///   per parameter per process to 8 / P, with the numerics of `data_parallel` (bit for bit: the update is
///   elementwise).
/// - `accel::zero2<Backend>` also shards the gradients: each finished bucket is reduce-scattered while backward goes
///   on, each process keeps only the averaged slices it steps, and the full gradients are released.
/// - `accel::fully_sharded<Backend>` also shards the parameters: between a step and the next forward each process
///   holds only its slices (each model parameter is set to its slice, flat). The full parameters of the model are
///   all-gathered before its forward and let go after the step, except those of each `accel::shard_unit`
///   (shard_unit.hpp), gathered around the unit's forward and again around its backward
///   (detail/sharding/unit_schedule.hpp).
///
///     accel::accelerator<accel::bf16, accel::zero2<accel::gloo>, accel::accumulate<4>> acc;
///
/// Prepare the model before its optimizer (`acc.prepare(model, optimizer)`), and the optimizer before its first
/// step; clear gradients with the prepared optimizer's `zero_grad()` (the optimizer steps slices of the gradients
/// that call clears).
#pragma once

#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "detail/sharding/owned_shards.hpp"
#include "detail/sharding/unit_schedule.hpp"
#include "detail/sharding/view_shards.hpp"
#include "detail/support/scope.hpp"
#include "parallel.hpp"
#include "shard_unit.hpp"

namespace accel {
namespace detail {

/// What the sharded policies share: data parallelism over `Backend` whose gradients are laid out as `Layout` says
/// (all-reduced in full, or reduce-scattered into each process's slices), and each prepared optimizer re-pointed onto
/// this process's `Shards` of its parameters (views of the full parameters, or slices with storage of their own).
template <class Backend, gradient_layout Layout, class Shards>
struct sharded_optimizer : bucketed_data_parallel<Backend, Layout> {
  using base = bucketed_data_parallel<Backend, Layout>;
  /// Each process steps only its shards: it cannot step the whole model alone (local_sgd).
  static constexpr bool steps_alone = false;

  explicit sharded_optimizer(const options& opts)
      : base(opts), buckets_(opts.buckets), sharding_(opts.sharding), timeout_(opts.timeout) {}

  /// As `data_parallel`, and remembers the model's parameters: the optimizer prepared next may only shard those.
  /// `group_of` keeps each gradient bucket within a group of parameters; the parameters `built_sliced` names are not
  /// broadcast (each process holds its own slice of them only).
  void prepare_model(torch::nn::Module& module, const std::function<std::size_t(const at::Tensor&)>& group_of = {},
                     const std::function<bool(const at::Tensor&)>& built_sliced = {}) {
    base::prepare_model(module, group_of, built_sliced);
    for (const auto& p : module.parameters()) prepared_.insert(p.unsafeGetTensorImpl());
  }

  /// Re-points `optimizer` onto this process's shards of its trainable parameters (`shard_arguments...` go to the
  /// shards' constructor after the common ones).
  template <class Optimizer, class... ShardArguments>
  void prepare_optimizer(Optimizer& optimizer, const ShardArguments&... shard_arguments) {
    static_assert(!std::derived_from<Optimizer, torch::optim::LBFGS>,
                  "accel's sharded policies: torch::optim::LBFGS cannot be sharded: its step reads every gradient at "
                  "once (line search, curvature pairs), not element by element; use accel::data_parallel for it");
    std::erase_if(shards_, [&optimizer](const auto& entry) { return entry.first == &optimizer; });
    shards_.emplace_back(
        &optimizer,
        std::make_unique<Shards>(
            optimizer, this->process_index(), this->num_processes(), buckets_,
            [this](const at::Tensor& p) { return prepared_.contains(p.unsafeGetTensorImpl()); }, shard_arguments...));
  }

  void attach_gradients(torch::optim::Optimizer& optimizer) {
    if (auto* shards = shards_of(optimizer)) shards->attach_gradients(reduced_gradient());
  }
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
    // The shards' gradients are views, which LibTorch's zero_grad cannot detach: they go first.
    if (auto* shards = shards_of(optimizer)) shards->zero_grad(set_to_none, reduced_gradient());
    compat::zero_grad(optimizer, set_to_none);  // frozen and replicated parameters
  }
  /// Each process checked its own shards: any process's overflow is everyone's, so all skip alike.
  [[nodiscard]] bool any_non_finite(bool found_here) {
    auto flag = at::full({1}, found_here ? 1.0f : 0.0f);
    this->communicator().all_reduce(flag, reduction::max).wait();
    return flag.template item<float>() > 0;
  }
  /// The total norm of the gradients of `parameters`: each process's shards, and the replicated parameters once,
  /// summed by one all-reduce.
  [[nodiscard]] double gradient_norm(const std::vector<at::Tensor>& parameters, double norm_type) {
    at::NoGradGuard no_grad;
    const bool infinity = std::isinf(norm_type);
    std::vector<at::Tensor> norms;
    for (const auto& piece : owned_gradients(parameters, infinity)) norms.push_back(piece.norm(norm_type));
    // One value read back, not one per parameter: this process's max, or its sum of p-th powers.
    auto total = at::zeros({1}, at::kDouble);
    if (!norms.empty()) {
      const auto stacked = at::stack(norms).to(at::kDouble);
      total[0] = infinity ? stacked.max() : stacked.pow(norm_type).sum();
    }
    this->communicator().all_reduce(total, infinity ? reduction::max : reduction::sum).wait();
    const double sum = total.template item<double>();
    return infinity ? sum : std::pow(sum, 1.0 / norm_type);
  }
  /// Scales this process's gradient shards (and the replicated gradients) so that the total norm is at most
  /// `max_norm`, as `clip_grad_norm_` does; returns the total norm before.
  double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
    const double total = gradient_norm(parameters, norm_type);
    const double coefficient = max_norm / (total + 1e-6);
    if (coefficient < 1.0) scale_gradients(parameters, coefficient);
    return total;
  }

  /// Checkpoints hold the optimizer's full state, as under `data_parallel`: `save_state` gathers it from every
  /// process's shard around `write` (the main process writes it), and `load_state` keeps this process's slice of
  /// what it loads, so a checkpoint moves between data_parallel and the sharded policies.
  template <class Write>
  void with_full_optimizer_state(torch::optim::Optimizer& optimizer, Write&& write) {
    if (auto* shards = shards_of(optimizer))
      shards->with_full_state(optimizer, this->communicator(), std::forward<Write>(write));
    else
      std::forward<Write>(write)();
  }
  template <class Load>
  void load_full_optimizer_state(torch::optim::Optimizer& optimizer, Load&& load) {
    if (auto* shards = shards_of(optimizer))
      shards->load_full_state(optimizer, std::forward<Load>(load));
    else
      std::forward<Load>(load)();
  }
  /// What `save_state` writes: `options::sharding.state_dict`.
  [[nodiscard]] state_dict_type checkpoint_format() const noexcept { return sharding_.state_dict; }
  /// This process's slice of `parameter` (flat) and its full shape, when an optimizer's shards hold it.
  [[nodiscard]] std::optional<parameter_shard> shard_of(const at::Tensor& parameter) const {
    for (const auto& [optimizer, shards] : shards_)
      if (auto shard = shards->shard_of(parameter)) return shard;
    return std::nullopt;
  }

  /// Forgets every prepared model and optimizer (`free_memory`).
  void release_models() {
    base::release_models();
    prepared_.clear();
    shards_.clear();
  }

  /// The shards of a prepared optimizer, for tests and benchmarks (none for an optimizer not prepared here).
  [[nodiscard]] const Shards* shards_of(const torch::optim::Optimizer& optimizer) const {
    const auto found = std::find_if(shards_.begin(), shards_.end(),
                                    [&optimizer](const auto& entry) { return entry.first == &optimizer; });
    return found == shards_.end() ? nullptr : found->second.get();
  }

 protected:
  Shards* shards_of(const torch::optim::Optimizer& optimizer) {
    return const_cast<Shards*>(std::as_const(*this).shards_of(optimizer));
  }

  /// Where a shard's gradient is kept apart from the full one: a sharded layout's reducers keep each process's
  /// reduced slices (null: none kept, the shard is a slice of the full gradient).
  auto reduced_gradient() {
    return [this](const at::Tensor& full) -> at::Tensor* {
      if constexpr (Layout == gradient_layout::sharded)
        return this->shard_gradient(full);
      else
        return nullptr;
    };
  }

  /// Multiplies the gradients of `parameters` this process holds by `coefficient`: its shards' and the replicated
  /// ones (a clipping decided here, or across the tp group too under tensor parallelism).
  void scale_gradients(const std::vector<at::Tensor>& parameters, double coefficient) {
    at::NoGradGuard no_grad;
    for (auto& piece : owned_gradients(parameters, true)) piece.mul_(coefficient);
  }

  /// The gradients of `parameters` this process accounts for: its slice of each sharded one, and the replicated
  /// ones in full on process 0 (on every process with `everywhere`: a maximum, or a scaling, counts them once anyway).
  std::vector<at::Tensor> owned_gradients(const std::vector<at::Tensor>& parameters, bool everywhere) {
    std::vector<at::Tensor> pieces;
    for (const auto& p : parameters) {
      std::optional<at::Tensor> owned;
      for (auto& [optimizer, shards] : shards_)
        if ((owned = shards->owned_gradient(p))) break;
      if (owned && owned->defined() && owned->numel() > 0)  // nothing owned: no piece (an empty one has no inf-norm)
        pieces.push_back(*owned);
      else if (!owned && p.grad().defined() && (everywhere || this->process_index() == 0))
        pieces.push_back(p.grad());
    }
    return pieces;
  }

  bucket_options buckets_;
  sharding_options sharding_;
  std::chrono::milliseconds timeout_;
  std::unordered_set<const void*> prepared_;
  std::vector<std::pair<const torch::optim::Optimizer*, std::unique_ptr<Shards>>> shards_;
};

/// zero1 and zero2: the optimizer's shards are views of the full parameters, which stay full: after each step, an
/// all-gather per bucket gives every process the others' updated slices.
template <class Backend, gradient_layout Layout>
struct zero_redundancy : sharded_optimizer<Backend, Layout, view_shards> {
  using sharded_optimizer<Backend, Layout, view_shards>::sharded_optimizer;

  /// Steps this process's shards, then gathers every process's into the full parameters.
  void step_optimizer(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    if (auto* shards = this->shards_of(optimizer)) shards->gather(this->communicator());
  }
};

}  // namespace detail

/// ZeRO stage 1: the optimizer state sharded across processes.
template <class Backend>
struct zero1 : detail::zero_redundancy<Backend, detail::gradient_layout::replicated> {
  using detail::zero_redundancy<Backend, detail::gradient_layout::replicated>::zero_redundancy;
  [[nodiscard]] static std::string name() { return "zero1<" + std::string(Backend::name) + ">"; }
  /// ZeRO stages 1 and 2 are DeepSpeed's in Accelerate.
  [[nodiscard]] static constexpr std::string_view distributed_type() noexcept { return "DEEPSPEED"; }
};

/// ZeRO stage 2: the optimizer state and the gradients sharded across processes.
template <class Backend>
struct zero2 : detail::zero_redundancy<Backend, detail::gradient_layout::sharded> {
  using detail::zero_redundancy<Backend, detail::gradient_layout::sharded>::zero_redundancy;
  [[nodiscard]] static std::string name() { return "zero2<" + std::string(Backend::name) + ">"; }
  [[nodiscard]] static constexpr std::string_view distributed_type() noexcept { return "DEEPSPEED"; }
};

/// Fully sharded data parallelism (FSDP, ZeRO stage 3): the parameters sharded too, gathered for the whole model
/// around forward and backward, or per `accel::shard_unit`.
template <class Backend>
struct fully_sharded : detail::sharded_optimizer<Backend, detail::gradient_layout::sharded, detail::owned_shards> {
  using base = detail::sharded_optimizer<Backend, detail::gradient_layout::sharded, detail::owned_shards>;
  using base::base;
  [[nodiscard]] static std::string name() { return "fully_sharded<" + std::string(Backend::name) + ">"; }
  [[nodiscard]] static constexpr std::string_view distributed_type() noexcept { return "FSDP"; }
  /// Between steps each process holds only its slices of the parameters.
  static constexpr bool keeps_parameter_slices = true;
  /// A model built by `accel::construct_sharded` (its shard units holding this process's slices only, over the
  /// processes of the group it shards over: `construction_slice()`) is prepared from those slices.
  static constexpr bool takes_constructed_slices = true;

  /// Which slice of each unit's parameters `accel::construct_sharded` keeps on this process: its index in the group
  /// the policy shards over, and that group's size.
  [[nodiscard]] std::pair<int, int> construction_slice() const noexcept {
    return {base::process_index(), base::num_processes()};
  }

  /// As the other sharded policies, and finds the model's shard units first: their gradient buckets stay within
  /// the unit. The parameters of units built by construct_sharded are not broadcast: their slices are this
  /// process's already (the same initialisation on every process, which construct_sharded checked).
  void prepare_model(torch::nn::Module& module) {
    prepare_model_after(module, [](const std::function<bool(const at::Tensor&)>&) {});
  }
  /// At prepare, before `prepare_model`: the precision policy's encoding (none: every parameter in its own type).
  /// The shards of the optimizers prepared from now on gather the parameters it encodes that way for each forward
  /// (fp8's float8 all-gather).
  void use_gather_encoding(std::shared_ptr<detail::parameter_encoding> encoding) { encoding_ = std::move(encoding); }
  /// Re-points `optimizer` onto shards with storage of their own, in groups by unit, and lets the full parameters
  /// go; then (re)builds the units' schedule from every optimizer's shards.
  template <class Optimizer>
  void prepare_optimizer(Optimizer& optimizer) {
    const std::function<at::Tensor(const at::Tensor&)> constructed_slice = [this](const at::Tensor& p) {
      const auto found = constructed_.find(p.unsafeGetTensorImpl());
      if (found == constructed_.end()) return at::Tensor();
      auto slice = std::move(found->second);
      constructed_.erase(found);  // the shards own it now
      return slice;
    };
    base::prepare_optimizer(optimizer, unit_group_of(), encoding_, constructed_slice);
    schedule_units();
  }
  /// Steps this process's shards, then lets the full parameters go until the next forward gathers them.
  void step_optimizer(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    if (auto* shards = this->shards_of(optimizer)) shards->release();
  }
  /// The full parameters of `module` outside its shard units, gathered before its forward (those of the optimizers
  /// that list any of its parameters: another model's stay released); the units gather their own.
  void before_forward(const torch::nn::Module& module) {
    refuse_unclaimed_slices(module);
    for (auto* shards : shards_listing(module)) shards->gather_group(0, this->communicator());
    if (schedule_) schedule_->begin_forward();
    base::before_forward(module);
  }
  /// Runs `action` with `module`'s parameters full (gathered for the while: a collective) and keeps what it writes
  /// into them: checkpoints save and load full weights through it.
  template <class Action>
  void with_full_parameters(torch::nn::Module& module, Action&& action) {
    const auto listing = shards_listing(module);
    std::vector<std::tuple<detail::owned_shards*, std::size_t, detail::parameter_state>> before;
    for (auto* shards : listing)
      for (const auto group : shards->groups()) {
        shards->finish_gather_group(group);  // a prefetch on its way lands first
        before.emplace_back(shards, group, shards->state(group));
      }
    for (auto& [shards, group, state] : before)
      shards->gather_group(group, this->communicator(), detail::gather_purpose::full);
    const auto back_as_before = detail::scope_exit([&] {
      for (auto& [shards, group, state] : before)
        if (state == detail::parameter_state::at_rest)
          shards->rest_group(group);
        else if (state == detail::parameter_state::freed)
          shards->free_group(group);
    });
    std::forward<Action>(action)();
    for (auto* shards : listing) shards->take_slices_of_full();
  }
  /// Runs `action` with `module`'s sharded parameters at rest, each its slice only, flat, in the shard's storage:
  /// a load writes this process's slices there without gathering anything (a gathered group is let go: its next
  /// use gathers it again, as after a step).
  template <class Action>
  void with_parameters_at_rest(torch::nn::Module& module, Action&& action) {
    for (auto* shards : shards_listing(module)) shards->release();
    std::forward<Action>(action)();
  }
  /// `parameter` in full: a released one is gathered (a collective then, one parameter at a time).
  [[nodiscard]] at::Tensor full_parameter(const at::Tensor& parameter) {
    for (auto& [optimizer, shards] : this->shards_)
      if (auto gathered = shards->gathered_parameter(parameter, this->communicator())) return *gathered;
    return parameter;
  }
  /// First gives the parameters their full elements back: a collective, as free_memory then is. The shard units
  /// forget the policy and only forward.
  void release_models() {
    for (auto& [optimizer, shards] : this->shards_) shards->materialize(this->communicator());
    schedule_.reset();
    constructed_.clear();
    units_.clear();
    unit_of_.clear();
    unit_accumulators_.clear();
    base::release_models();
  }
  /// When the shard units gather and let go (none without units), for tests.
  [[nodiscard]] const auto* unit_schedule() const noexcept { return schedule_.get(); }

 protected:
  using gather_communicator =
      std::remove_reference_t<decltype(*std::declval<typename base::communicator_type&>().separate(std::string()))>;
  /// What the units gather on when the policy's group is not the job's (hybrid sharding): a group of the same
  /// processes as `communicator()`'s, kept for the process's life. None: the job's separate group.
  void gather_units_on(gather_communicator& gathers) noexcept { unit_gathers_ = &gathers; }
  /// `prepare_model`, with `before_sharding(built_sliced)` run once the units are found and before anything is
  /// sharded: hybrid sharding's broadcast across the replicas, which skips what construct_sharded built sliced.
  template <class BeforeSharding>
  void prepare_model_after(torch::nn::Module& module, BeforeSharding&& before_sharding) {
    find_units(module);
    const std::function<bool(const at::Tensor&)> built_sliced = [this](const at::Tensor& p) {
      return constructed_.contains(p.unsafeGetTensorImpl());
    };
    std::forward<BeforeSharding>(before_sharding)(built_sliced);
    base::prepare_model(module, unit_group_of(), built_sliced);
  }

 private:
  /// The shards of the optimizers that list any of `module`'s parameters, in the order they were prepared (the
  /// same on every process: they gather in that order).
  std::vector<detail::owned_shards*> shards_listing(const torch::nn::Module& module) {
    const auto parameters = module.parameters();
    std::vector<detail::owned_shards*> listing;
    for (auto& [optimizer, shards] : this->shards_)
      if (std::any_of(parameters.begin(), parameters.end(),
                      [&shards](const at::Tensor& p) { return shards->span_of(p) != nullptr; }))
        listing.push_back(shards.get());
    return listing;
  }

  /// The shard units of `module`, numbered from 1 on in the order of its modules (0: a parameter of no unit); a
  /// parameter belongs to the innermost unit that holds it. A parameter registered in modules of two units (a tied
  /// weight) is refused: each unit gathers and frees its own parameters, so the other would find it freed.
  void find_units(torch::nn::Module& module) {
    refuse_tied_across_units(module);
    for (const auto& submodule : module.modules()) {  // each module before its own submodules
      auto* unit = dynamic_cast<detail::shard_unit_base*>(submodule.get());
      if (unit == nullptr) continue;
      units_.push_back(unit);
      for (auto& kept : unit->take_constructed_slices())
        constructed_[kept.parameter.unsafeGetTensorImpl()] = std::move(kept.slice);
      for (const auto& p : submodule->parameters()) {
        unit_of_[p.unsafeGetTensorImpl()] = units_.size();
        // Taken now, while the parameter has its full shape, which the node records: one made at rest would
        // expect gradients of the slice's shape (the unit schedule hooks these same nodes).
        if (p.requires_grad()) unit_accumulators_.push_back(torch::autograd::impl::grad_accumulator(p));
      }
    }
  }
  /// Throws when a parameter is registered directly in two modules whose innermost units differ (or one of which is
  /// in no unit), naming the parameter by both its names and the two units by theirs.
  static void refuse_tied_across_units(torch::nn::Module& module) {
    std::vector<std::string> unit_names;  // in pre-order: an enclosing unit comes before the units inside it
    std::unordered_map<const void*, std::pair<std::string, std::string>> first_seen;  // name, unit
    for (const auto& item : module.named_modules()) {
      if (dynamic_cast<detail::shard_unit_base*>(item.value().get()) != nullptr) unit_names.push_back(item.key());
      std::string unit = "(no unit)";
      for (const auto& name : unit_names)  // the innermost: the last that encloses this module
        if (name.empty() || item.key() == name || item.key().starts_with(name + ".")) unit = "'" + name + "'";
      for (const auto& parameter : item.value()->named_parameters(/*recurse=*/false)) {
        const auto name = item.key().empty() ? parameter.key() : item.key() + "." + parameter.key();
        const auto [seen, first] = first_seen.try_emplace(parameter.value().unsafeGetTensorImpl(), name, unit);
        if (!first && seen->second.second != unit)
          throw std::invalid_argument(
              "accel::fully_sharded: the parameter " + seen->second.first + " is also " + name +
              " (a tied weight), in the shard units " + seen->second.second + " and " + unit +
              "; each unit gathers and frees its own parameters, so a parameter shared by two cannot be: wrap the "
              "modules that share it in one shard unit, or leave both outside any");
      }
    }
  }
  /// A parameter's group, for the buckets of the reducer and of the shards: its unit's number, or 0. None without
  /// units, which leaves the buckets as data_parallel's.
  std::function<std::size_t(const at::Tensor&)> unit_group_of() const {
    if (unit_of_.empty()) return {};
    return [this](const at::Tensor& p) {
      const auto found = unit_of_.find(p.unsafeGetTensorImpl());
      return found == unit_of_.end() ? std::size_t{0} : found->second;
    };
  }
  /// (Re)builds what gathers and lets go the units' parameters from the shards prepared so far, and attaches it to
  /// the units. Its gathers have a communicator of their own (unit_schedule.hpp).
  void schedule_units() {
    if (units_.empty()) return;
    std::vector<detail::unit_parameters> units(units_.size());
    for (std::size_t u = 0; u < units.size(); ++u) {
      units[u].group = u + 1;
      for (auto& [optimizer, shards] : this->shards_) {
        if (!shards->holds_group(u + 1)) continue;
        units[u].shards.push_back(shards.get());
        for (auto& p : shards->parameters_of(u + 1)) units[u].parameters.push_back(std::move(p));
      }
    }
    auto& gathers = unit_gathers_ != nullptr
                        ? *unit_gathers_
                        : detail::separate_process_group<typename base::communicator_type>(this->timeout_);
    schedule_ =
        std::make_shared<detail::unit_schedule<gather_communicator>>(gathers, this->sharding_, std::move(units));
    for (std::size_t u = 0; u < units_.size(); ++u) units_[u]->attach(schedule_, u);
  }

  /// A forward before the optimizer of a model built by construct_sharded was prepared would find its units'
  /// parameters holding nothing.
  void refuse_unclaimed_slices(const torch::nn::Module& module) const {
    if (constructed_.empty()) return;
    const auto parameters = module.parameters();
    if (std::any_of(parameters.begin(), parameters.end(),
                    [this](const at::Tensor& p) { return constructed_.contains(p.unsafeGetTensorImpl()); }))
      throw std::logic_error(
          "accel::fully_sharded: this model was built by accel::construct_sharded, and its shard units' parameters "
          "hold nothing until the optimizer that trains them is prepared; prepare it with the model, "
          "acc.prepare(model, optimizer), before the first forward");
  }

  std::vector<detail::shard_unit_base*> units_;              // the prepared models' units, in order
  std::unordered_map<const void*, at::Tensor> constructed_;  // built sliced, not yet taken by an optimizer's shards
  std::unordered_map<const void*, std::size_t> unit_of_;     // a parameter's TensorImpl -> its unit + 1
  std::vector<detail::compat::grad_accumulator_handle> unit_accumulators_;
  std::shared_ptr<detail::unit_schedule<gather_communicator>> schedule_;
  std::shared_ptr<detail::parameter_encoding> encoding_;
  gather_communicator* unit_gathers_ = nullptr;
};

}  // namespace accel
