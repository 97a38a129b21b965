/// \file
/// Precision policies: how the forward runs, how backward treats the loss, how the optimizer steps.
///
/// Available policies / when to use:
/// - `accel::fp32`: full precision. Costs nothing: no autocast guard, no scaler, no extra pass.
/// - `accel::bf16`: forward under bfloat16 autocast, fp32 master weights, no loss scaling (issue #6).
/// - `accel::fp16`: forward under float16 autocast plus dynamic loss scaling (issue #6).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "concepts.hpp"
#include "detail/diagnostics.hpp"
#include "detail/scope.hpp"
#include "options.hpp"

namespace accel {

/// Full precision: every hook is the plain LibTorch call.
struct fp32 {
  using policy_category = precision_tag;

  constexpr fp32() noexcept = default;
  constexpr explicit fp32(const options&) noexcept {}

  [[nodiscard]] constexpr detail::no_scope forward_scope(const c10::Device&) const noexcept { return {}; }
  void backward(const at::Tensor& loss) const { loss.backward(); }
  void step(torch::optim::Optimizer& optimizer) const { optimizer.step(); }
  [[nodiscard]] static constexpr bool step_was_skipped() noexcept { return false; }
};

/// bfloat16 autocast around the forward. Declared here so configurations name it; its hooks land with issue #6.
struct bf16 {
  using policy_category = precision_tag;

  template <class Options>
  explicit bf16(const Options&) {
    static_assert(detail::always_false<Options>,
                  "accel::bf16 lands with issue #6 (mixed precision); use accel::fp32 until then");
  }
  detail::no_scope forward_scope(const c10::Device&) const;
  void backward(const at::Tensor& loss) const;
  void step(torch::optim::Optimizer& optimizer) const;
  bool step_was_skipped() const;
};

/// float16 autocast plus dynamic loss scaling. Declared here so configurations name it; its hooks land with
/// issue #6.
struct fp16 {
  using policy_category = precision_tag;

  template <class Options>
  explicit fp16(const Options&) {
    static_assert(detail::always_false<Options>,
                  "accel::fp16 lands with issue #6 (mixed precision); use accel::fp32 until then");
  }
  detail::no_scope forward_scope(const c10::Device&) const;
  void backward(const at::Tensor& loss);
  void step(torch::optim::Optimizer& optimizer);
  bool step_was_skipped() const;
};

}  // namespace accel
