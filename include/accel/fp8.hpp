/// \file
/// `accel::fp8<Recipe>`: float8 training (Accelerate's `mixed_precision="fp8"`), a precision policy.
///
///     accel::accelerator<accel::fp8<>> acc;                             // torchao's tensorwise (dynamic) scaling
///     accel::accelerator<accel::fp8<accel::delayed_scaling>> te{{.fp8 = {.amax_history_len = 16}}};
///
/// At `prepare(model)` the model's Linear layers whose dimensions are multiples of 16, but its first and last
/// (Accelerate's `filter_first_and_last_linear_layers`, or `options::fp8.module_filter_func`), are converted: their
/// matmuls (forward, and both of backward) run through `at::_scaled_mm` on float8 casts of their operands, scaled
/// by the recipe, with outputs in the compute type (bfloat16: the forward runs under bfloat16 autocast, as
/// Accelerate's fp8 does; the model's outputs come back as float32). Weights stay the user's float32 (or bfloat16)
/// masters, the same parameters the optimizer holds; `unwrap_model` gives the user's modules back, unchanged, with
/// the trained weights. How: accel/detail/fp8/linear.hpp. Under `fully_sharded`,
/// `options::fp8.enable_fsdp_float8_all_gather` (tensorwise only) gathers the converted weights in float8:
/// accel/detail/fp8/float8_gather.hpp. Recipes:
/// - `tensorwise_scaling` (the default, torchao's): each tensor scaled by its own amax when it is cast; e4m3 forward,
///   e5m2 gradients (`fp8_format` hybrid).
/// - `rowwise_scaling` (torchao's rowwise): one scale per row of each operand (along the dimension its matmul
///   keeps), rounded down to a power of 2; e4m3 everywhere. Refused where `_scaled_mm` has no rowwise kernel.
/// - `delayed_scaling` (TransformerEngine's `DelayedScaling`): each tensor scaled from the amaxes of the last
///   `amax_history_len` optimizer steps (`amax_compute_algo`, `margin`, `fp8_format`), the amaxes reduced with a max
///   across processes at each step; its histories and scales are saved with the training state.
/// Needs LibTorch 2.4 or newer (float8 types and `at::_scaled_mm`); with an older one, naming `accel::fp8` is a
/// compile error that says so.
#pragma once

#include <concepts>
#include <string_view>
#include <type_traits>

#include "detail/config.hpp"
#include "concepts.hpp"
#include "detail/compat.hpp"
#include "detail/fp8/scaling.hpp"
#include "options.hpp"

namespace accel {

/// torchao's tensorwise (dynamic) scaling, its default: a tensor's scale from its own amax, when it is cast.
struct tensorwise_scaling {
  static constexpr std::string_view name = "fp8<tensorwise_scaling>";
  static constexpr auto scaling = detail::fp8::scaling::tensorwise;
};
/// torchao's rowwise scaling: a scale per row (or column) of each operand, powers of 2, e4m3 only.
struct rowwise_scaling {
  static constexpr std::string_view name = "fp8<rowwise_scaling>";
  static constexpr auto scaling = detail::fp8::scaling::rowwise;
};
/// TransformerEngine's delayed scaling: scales from the amax history of earlier steps.
struct delayed_scaling {
  static constexpr std::string_view name = "fp8<delayed_scaling>";
  static constexpr auto scaling = detail::fp8::scaling::delayed;
};

namespace detail {
namespace fp8 {
/// A recipe: its policy's name, and how it scales.
template <class Recipe>
concept recipe = requires {
  { Recipe::name } -> std::convertible_to<std::string_view>;
  requires std::same_as<std::remove_cv_t<decltype(Recipe::scaling)>, scaling>;
};
}  // namespace fp8

/// The compile-time refusal of `accel::fp8` on a LibTorch without float8: a template over the version (so that a
/// compile-fail test checks its message on any LibTorch) and the recipe (so that it fires where `fp8<...>` is named,
/// not where the header is included).
template <int TorchVersion, class Recipe = void>
struct require_float8 {
  static_assert(TorchVersion >= 204,
                "accel::fp8 needs LibTorch 2.4 or newer: the float8 types and at::_scaled_mm do not exist in this "
                "LibTorch (1.13 has neither); use accel::bf16 here");
  static constexpr bool value = true;
};
}  // namespace detail

}  // namespace accel

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_FLOAT8
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "checkpoint_error.hpp"
#include "collectives.hpp"
#include "detail/fp8/casts.hpp"
#include "detail/fp8/conversion.hpp"
#include "detail/fp8/delayed_scaling.hpp"
#include "detail/fp8/float8_gather.hpp"
#include "detail/fp8/linear.hpp"
#include "precision.hpp"

namespace accel {
namespace detail::fp8 {

/// The float8 types of a recipe: `options.fp8_format`, or the recipe's own; rowwise takes e4m3 only.
ACCEL_DECL fp8_format format_for(scaling kind, const fp8_options& options, std::string_view policy);

/// `options.fp8.enable_fsdp_float8_all_gather` is torchao's for its tensorwise (dynamic) recipe only: refused with
/// another.
ACCEL_DECL void check_float8_all_gather(scaling kind, const fp8_options& options, std::string_view policy);

/// What an fp8 policy keeps, on the heap: forwards and autograd hold pointers into it, and the float8 all-gather
/// holds its layers.
struct policy_state {
  layer_table layers;
  std::optional<amax_history> history;  // delayed scaling only
  bool recorded = false;                // a forward ran since the last update of the scales
};

}  // namespace detail::fp8

/// Float8 training with `Recipe` (`tensorwise_scaling`, `rowwise_scaling`, `delayed_scaling`): see the file
/// comment. Options: `options::fp8`.
template <class Recipe = tensorwise_scaling>
class fp8 : public precision_defaults {
  static_assert(detail::fp8::recipe<Recipe>,
                "accel::fp8's recipe is accel::tensorwise_scaling, accel::rowwise_scaling or accel::delayed_scaling");
  static constexpr detail::fp8::scaling kind = Recipe::scaling;

 public:
  using policy_category = precision_tag;
  using recipe_type = Recipe;
  [[nodiscard]] static constexpr std::string_view name() noexcept { return Recipe::name; }
  [[nodiscard]] static constexpr std::string_view mixed_precision() noexcept { return "fp8"; }

  /// Checks the options, that this device autocasts to bfloat16 and that its `_scaled_mm` takes the recipe's
  /// operands; installs the Linear routing (once per process).
  fp8(const options& opts, const c10::Device& device)
      : options_(opts.fp8),
        format_(detail::fp8::format_for(kind, opts.fp8, name())),
        state_(std::make_shared<detail::fp8::policy_state>()) {
    detail::fp8::check_float8_all_gather(kind, opts.fp8, name());
    detail::require_autocast(device, at::kBFloat16, "fp8", "use accel::fp32 on this device");
    if constexpr (kind == detail::fp8::scaling::delayed) state_->history.emplace(opts.fp8, device);
    detail::fp8::check_device(device, kind, format_, name());
    detail::routing::install_routing();
  }

  /// Alive around each forward: bfloat16 autocast, and this policy's layers computed in float8.
  [[nodiscard]] detail::fp8::routing_scope forward_scope(const c10::Device& device) const {
    state_->recorded = true;
    return {state_->layers, device.type()};
  }
  template <class Output>
  [[nodiscard]] static auto forward_output(Output&& output)
      -> decltype(detail::outputs_to_fp32(std::forward<Output>(output))) {
    return detail::outputs_to_fp32(std::forward<Output>(output));
  }

  /// At `prepare(model)`, on the device: lists the Linear layers that compute in float8.
  void prepare_model(torch::nn::Module& model) {
    detail::fp8::convert(model, options_, kind, format_, state_->history ? &*state_->history : nullptr, state_->layers);
    if (options_.enable_fsdp_float8_all_gather)
      detail::fp8::refuse_tied_gathered_weights(model, state_->layers, name());
  }
  /// With `enable_fsdp_float8_all_gather`: the converted weights gathered in float8 by a policy that gathers
  /// parameters (fully_sharded), the forward computing with them as they come; none without it.
  [[nodiscard]] std::shared_ptr<detail::parameter_encoding> gather_encoding() const {
    if (!options_.enable_fsdp_float8_all_gather) return nullptr;
    return std::make_shared<detail::fp8::float8_gather>(
        std::shared_ptr<detail::fp8::layer_table>(state_, &state_->layers),
        detail::fp8::dtype_of(format_, detail::fp8::role::weight));
  }

  /// Delayed scaling: once per step (the first optimizer's), the processes' amaxes since the last update are
  /// reduced with a max (TransformerEngine's `reduce_amax`), then the scales updated; then the parallel policy steps.
  template <class Parallel>
  void step(torch::optim::Optimizer& optimizer, Parallel& parallel) {
    if (state_->history && state_->recorded) {
      auto current = state_->history->current().clone();
      parallel.communicator().all_reduce(current, reduction::max).wait();
      state_->history->current().copy_(current);
      state_->history->update();
      state_->recorded = false;
    }
    parallel.step_optimizer(optimizer);
  }

  /// The names of the converted Linear layers, in the order they were found.
  [[nodiscard]] std::vector<std::string> converted_layers() const {
    std::vector<std::string> names;
    for (const auto& plan : state_->layers.plans()) names.push_back(plan.name);
    return names;
  }
  /// The float8 weight and its scale that the converted layer `layer` computes with as gathered (under fully_sharded
  /// with `enable_fsdp_float8_all_gather`, between the gather before a forward and the weight's release); none else.
  [[nodiscard]] std::optional<std::pair<at::Tensor, at::Tensor>> gathered_weight(const std::string& layer) const {
    for (const auto& plan : state_->layers.plans())
      if (plan.name == layer && plan.gathered) return std::pair{plan.gathered->data, plan.gathered->scale};
    return std::nullopt;
  }
  /// The float8 types in use.
  [[nodiscard]] fp8_format format() const noexcept { return format_; }
  /// Delayed scaling's amax histories and scales (three columns per converted layer: input, weight, gradient).
  [[nodiscard]] const detail::fp8::amax_history& scaling_state() const
    requires(kind == detail::fp8::scaling::delayed)
  {
    return *state_->history;
  }

  /// Checkpoints (delayed scaling): the amax histories and scales, in each process's `random_states` file.
  void save_state(torch::serialize::OutputArchive& archive) const
    requires(kind == detail::fp8::scaling::delayed)
  {
    archive.write("fp8_amax_history", state_->history->history().cpu());
    archive.write("fp8_scale", state_->history->scales().cpu());
  }
  void load_state(torch::serialize::InputArchive& archive)
    requires(kind == detail::fp8::scaling::delayed)
  {
    at::Tensor history, scales;
    if (!archive.try_read("fp8_amax_history", history) || !archive.try_read("fp8_scale", scales))
      throw checkpoint_error(
          "lacks the fp8 delayed scaling state (amax histories and scales): saved by another "
          "configuration?");
    if (!state_->history->fits(history, scales))
      throw checkpoint_error("holds fp8 amax histories of shape " + c10::str(history.sizes()) + ", where this run's " +
                             "layers and amax_history_len need " + c10::str(state_->history->history().sizes()) +
                             " (another model, filter or amax_history_len?)");
    state_->history->assign(history, scales);
  }

 private:
  fp8_options options_;
  fp8_format format_;
  std::shared_ptr<detail::fp8::policy_state> state_;
};

}  // namespace accel

#else  // a LibTorch without float8

namespace accel {
/// Refused at compile time: this LibTorch has no float8 (see `detail::require_float8`).
template <class Recipe = tensorwise_scaling>
struct fp8 {
  static_assert(detail::require_float8<ACCEL_TORCH_VERSION, Recipe>::value);
};
}  // namespace accel

#endif

#if ACCEL_HEADER_ONLY
#include "impl/fp8.ipp"
#endif
