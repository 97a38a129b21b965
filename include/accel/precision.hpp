/// \file
/// Precision policies: how the forward runs, how backward treats the loss, how the optimizer steps.
///
/// Available policies / when to use:
/// - `accel::fp32`: full precision. Costs nothing: no autocast guard, no scaler, no extra pass.
/// - `accel::bf16`: forward under bfloat16 autocast (CPU and CUDA), outputs returned in fp32, fp32 master
///   weights, no loss scaling.
/// - `accel::fp16`: forward under float16 autocast plus dynamic loss scaling (PyTorch's GradScaler algorithm).
///   Needs a device where LibTorch autocasts to float16: CUDA (and the CPU from LibTorch 2.4).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/config.hpp"
#include "checkpoint_error.hpp"
#include "concepts.hpp"
#include "detail/compat.hpp"
#include "detail/support/parameter_encoding.hpp"
#include "detail/support/scope.hpp"
#include "detail/support/tensor_structure.hpp"
#include "options.hpp"

namespace accel {
namespace detail {

/// Autocast to `dtype` on one device type for the scope: saves the previous state and dtype, restores them on
/// exit, and clears the cast cache when the outermost autocast scope ends, as Python's `torch.autocast` does.
/// Nesting-safe, and nothing leaks out of it.
class [[nodiscard]] autocast_scope {
 public:
  ACCEL_DECL autocast_scope(c10::DeviceType device, c10::ScalarType dtype);
  autocast_scope(const autocast_scope&) = delete;
  autocast_scope& operator=(const autocast_scope&) = delete;
  ACCEL_DECL ~autocast_scope();

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  c10::ScalarType previous_dtype_;
};

/// Accelerate's `convert_outputs_to_fp32`: float16/bfloat16 tensors of a forward's output, nested or not, come
/// back as float32; anything else is returned as it is.
template <class Output>
auto outputs_to_fp32(Output&& output)
    -> std::conditional_t<is_tensor_structure<std::remove_cvref_t<Output>>, std::remove_cvref_t<Output>, Output> {
  using type = std::remove_cvref_t<Output>;
  if constexpr (is_tensor_structure<type>) {
    auto to_fp32 = [](const at::Tensor& t) {
      return t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16) ? t.to(at::kFloat) : t;
    };
    return map_tensors(output, to_fp32);
  } else {
    return std::forward<Output>(output);
  }
}

/// Checks that this LibTorch autocasts to `dtype` on `device`, naming the policy and the fix when it does not.
ACCEL_DECL void require_autocast(const c10::Device& device, c10::ScalarType dtype, const char* policy,
                                 const char* suggestion);

/// Multiplies `grads` (all on one device) by `inverse` in place and returns whether any element was inf/NaN before:
/// LibTorch's fused `_amp_foreach_non_finite_check_and_unscale_`, one pass over all of them (its CPU kernel exists
/// from LibTorch 2.3 on: `compat::fused_unscale_available`).
ACCEL_DECL bool unscale_fused(std::vector<at::Tensor>& grads, float inverse);

/// The same arithmetic a gradient at a time, with one synchronisation at the end: for LibTorch without the kernel.
ACCEL_DECL bool unscale_each(std::vector<at::Tensor>& grads, float inverse);

/// Dynamic loss scaling, PyTorch's GradScaler algorithm: scale the loss, unscale each optimizer's gradients once
/// per step (checking them for inf/NaN), skip the step on overflow, then update the scale. The scale is a float32
/// as in PyTorch, so the sequence of scales is the same bit for bit.
class grad_scaler {
 public:
  /// What a checkpoint saves.
  struct state_type {
    float scale;
    int growth_tracker;
  };

  ACCEL_DECL explicit grad_scaler(const grad_scaler_options& opts);

  /// The loss times the scale, in float32 at least (an fp16 loss times 65536 would overflow). The first backward
  /// after a step starts a new iteration: what was unscaled or skipped before belongs to the last one.
  [[nodiscard]] ACCEL_DECL at::Tensor scale(const at::Tensor& loss);

  /// Divides `optimizer`'s gradients by the scale their backward used and records whether any is inf/NaN, as
  /// `agree(found here)` decides for every process. Once per iteration: a second call before the step does nothing
  /// (Accelerate issue #641: clipping then stepping must not unscale twice).
  template <class Agree>
  void unscale(torch::optim::Optimizer& optimizer, Agree&& agree) {
    auto& state = current_state(optimizer);
    if (state.unscaled) return;
    state.found_inf = std::forward<Agree>(agree)(unscale_gradients(optimizer));
    state.unscaled = true;
  }

  /// Runs `step_optimizer()` unless `optimizer`'s gradients overflowed, then updates the scale (after each
  /// optimizer's step, as Accelerate calls `scaler.update()`). Returns whether it skipped.
  template <class Agree, class Step>
  bool step(torch::optim::Optimizer& optimizer, Agree&& agree, Step&& step_optimizer) {
    unscale(optimizer, std::forward<Agree>(agree));
    const bool found_inf = current_state(optimizer).found_inf;
    per_optimizer_.erase(&optimizer);
    if (!found_inf) std::forward<Step>(step_optimizer)();
    update(found_inf);
    step_taken_ = true;
    any_skipped_ = any_skipped_ || found_inf;
    return found_inf;
  }

  /// Whether any optimizer step of the current iteration was skipped (Accelerate: `any` over its optimizers).
  [[nodiscard]] bool any_step_skipped() const noexcept { return any_skipped_; }
  /// Whether `optimizer`'s gradients are already unscaled in this iteration.
  [[nodiscard]] ACCEL_DECL bool unscaled(const torch::optim::Optimizer& optimizer) const;
  [[nodiscard]] state_type state() const noexcept { return {scale_, growth_tracker_}; }
  ACCEL_DECL void load_state(const state_type& state) noexcept;
  [[nodiscard]] const grad_scaler_options& options() const noexcept { return options_; }

 private:
  struct optimizer_state {
    std::uint64_t iteration = 0;
    bool unscaled = false;
    bool found_inf = false;
  };

  /// This iteration's state of `optimizer`: an optimizer that did not step last time starts afresh.
  ACCEL_DECL optimizer_state& current_state(const torch::optim::Optimizer& optimizer);

  /// PyTorch's `_amp_update_scale_`: back off on overflow, grow after `growth_interval` clean steps in a row.
  ACCEL_DECL void update(bool found_inf);

  /// Unscales every gradient in place and returns whether any element is inf/NaN: one fused pass per device
  /// where LibTorch has the kernel, else a pass per gradient with one synchronisation at the end.
  ACCEL_DECL bool unscale_gradients(torch::optim::Optimizer& optimizer) const;

  grad_scaler_options options_;
  float scale_;
  float backward_scale_ = scale_;
  int growth_tracker_ = 0;
  std::uint64_t iteration_ = 0;
  bool step_taken_ = false;
  bool any_skipped_ = false;
  std::map<const torch::optim::Optimizer*, optimizer_state> per_optimizer_;
};

}  // namespace detail

/// The hooks a precision policy may leave out (concepts.hpp), with what full precision does: derive from it and
/// define what differs. A policy that changes how the optimizer steps still leaves the step itself to the parallel
/// policy (`parallel.step_optimizer`), which knows which parameters this process updates.
struct precision_defaults {
  /// What the configuration names it, and the `mixed_precision` value that selects it in `accel::dispatch`
  /// (none: only by its type).
  [[nodiscard]] static constexpr std::string_view name() noexcept { return "a custom precision policy"; }
  [[nodiscard]] static constexpr std::string_view mixed_precision() noexcept { return ""; }
  /// At `prepare(model)`, on the device, before the parallel policy sees the model (fp8 lists its float8 layers here).
  static constexpr void prepare_model(torch::nn::Module&) noexcept {}
  /// At prepare, handed to the parallel policy: how it may gather some parameters in a smaller type that this
  /// policy's forward computes with (fp8 with `enable_fsdp_float8_all_gather`); none: in their own.
  [[nodiscard]] static std::shared_ptr<detail::parameter_encoding> gather_encoding() noexcept { return nullptr; }
  static void backward(const at::Tensor& loss) { loss.backward(); }
  /// Nothing to unscale without loss scaling.
  template <class Parallel>
  static constexpr void unscale(torch::optim::Optimizer&, Parallel&) noexcept {}
  template <class Parallel>
  static void step(torch::optim::Optimizer& optimizer, Parallel& parallel) {
    parallel.step_optimizer(optimizer);
  }
  [[nodiscard]] static constexpr bool step_was_skipped() noexcept { return false; }
  [[nodiscard]] static constexpr double loss_scale() noexcept { return 1.0; }
};

/// Full precision: every hook is the plain LibTorch call.
struct fp32 : precision_defaults {
  using policy_category = precision_tag;
  [[nodiscard]] static constexpr std::string_view name() noexcept { return "fp32"; }
  [[nodiscard]] static constexpr std::string_view mixed_precision() noexcept { return "no"; }

  constexpr fp32() noexcept = default;
  constexpr fp32(const options&, const c10::Device&) noexcept {}

  [[nodiscard]] constexpr detail::no_scope forward_scope(const c10::Device&) const noexcept { return {}; }
  /// The output as it is: moved out when the forward returned a value, a reference when it returned one.
  template <class Output>
  [[nodiscard]] static constexpr Output forward_output(Output&& output) noexcept {
    return std::forward<Output>(output);
  }
};

/// bfloat16 autocast around the forward, outputs back in float32, float32 master weights, no loss scaling.
struct bf16 : precision_defaults {
  using policy_category = precision_tag;
  [[nodiscard]] static constexpr std::string_view name() noexcept { return "bf16"; }
  [[nodiscard]] static constexpr std::string_view mixed_precision() noexcept { return "bf16"; }

  ACCEL_DECL bf16(const options&, const c10::Device& device);

  [[nodiscard]] detail::autocast_scope forward_scope(const c10::Device& device) const {
    return {device.type(), at::kBFloat16};
  }
  template <class Output>
  [[nodiscard]] static auto forward_output(Output&& output)
      -> decltype(detail::outputs_to_fp32(std::forward<Output>(output))) {
    return detail::outputs_to_fp32(std::forward<Output>(output));
  }
};

/// float16 autocast around the forward, outputs back in float32, float32 master weights, and dynamic loss scaling
/// (`options::grad_scaler`).
struct fp16 : precision_defaults {
  using policy_category = precision_tag;
  [[nodiscard]] static constexpr std::string_view name() noexcept { return "fp16"; }
  [[nodiscard]] static constexpr std::string_view mixed_precision() noexcept { return "fp16"; }

  ACCEL_DECL fp16(const options& opts, const c10::Device& device);

  [[nodiscard]] detail::autocast_scope forward_scope(const c10::Device& device) const {
    return {device.type(), at::kHalf};
  }
  template <class Output>
  [[nodiscard]] static auto forward_output(Output&& output)
      -> decltype(detail::outputs_to_fp32(std::forward<Output>(output))) {
    return detail::outputs_to_fp32(std::forward<Output>(output));
  }
  void backward(const at::Tensor& loss) { scaler_.scale(loss).backward(); }
  /// Every process agrees on whether any gradient overflowed (the parallel policy decides how), and so skips alike.
  template <class Parallel>
  void unscale(torch::optim::Optimizer& optimizer, Parallel& parallel) {
    scaler_.unscale(optimizer, [&parallel](bool found) { return parallel.any_non_finite(found); });
  }
  template <class Parallel>
  void step(torch::optim::Optimizer& optimizer, Parallel& parallel) {
    scaler_.step(
        optimizer, [&parallel](bool found) { return parallel.any_non_finite(found); },
        [&] { parallel.step_optimizer(optimizer); });
  }
  /// Whether an optimizer step of this iteration was skipped for overflow.
  [[nodiscard]] bool step_was_skipped() const noexcept { return scaler_.any_step_skipped(); }
  /// What gradients are multiplied by until they are unscaled.
  [[nodiscard]] double loss_scale() const noexcept { return scaler_.state().scale; }

  /// Checkpoints: the scale and the clean steps since it last changed, in each process's `random_states` file.
  ACCEL_DECL void save_state(torch::serialize::OutputArchive& archive) const;
  ACCEL_DECL void load_state(torch::serialize::InputArchive& archive);

  /// The loss scaler: its state, its options.
  [[nodiscard]] const detail::grad_scaler& scaler() const noexcept { return scaler_; }
  [[nodiscard]] detail::grad_scaler& scaler() noexcept { return scaler_; }

 protected:
  /// Loss scaling without the device check, for a derived policy that tests it where float16 autocast is missing.
  explicit fp16(const options& opts) : scaler_(opts.grad_scaler) {}

 private:
  detail::grad_scaler scaler_;
};

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/precision.ipp"
#endif
