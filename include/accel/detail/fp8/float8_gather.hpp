/// \file
/// fp8's float8 all-gather (torchao's `enable_fsdp_float8_all_gather`), as a `parameter_encoding` that fp8 hands a
/// policy which gathers parameters (fully_sharded): each converted weight's slices are cast to float8 with the scale
/// of the processes' largest amax (the whole weight's amax, so the scale and every cast byte are those of casting the
/// whole weight), gathered as bytes, and given to the layer's plan, whose forward and backward take them as they are.
// IWYU pragma: private, include <accel/fp8.hpp>
#pragma once

#include "../config.hpp"
#include "../compat.hpp"  // ACCEL_HAS_FLOAT8: on a LibTorch without float8 this header declares nothing

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_FLOAT8
#include <torch/nn/module.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../support/parameter_encoding.hpp"
#include "casts.hpp"
#include "linear.hpp"

namespace accel::detail::fp8 {

/// The converted layers' weights gathered in `type` (e4m3 but with fp8_format e5m2), tensorwise scaled.
class float8_gather final : public parameter_encoding {
 public:
  float8_gather(std::shared_ptr<layer_table> layers, c10::ScalarType type) : layers_(std::move(layers)), type_(type) {}

  [[nodiscard]] bool encodes(const at::Tensor& parameter) const override {
    return layers_->plan_of(parameter) != nullptr;
  }
  [[nodiscard]] c10::ScalarType encoded_type() const override { return type_; }
  /// The slice's amax (0 for an empty one, which adds nothing to a maximum of absolute values).
  [[nodiscard]] ACCEL_DECL at::Tensor local_maximum(const at::Tensor& slice) const override;
  [[nodiscard]] ACCEL_DECL at::Tensor encode(const at::Tensor& slice, const at::Tensor& maximum) const override;
  /// The float8 values divided by the scale: what the layer's matmul multiplies by.
  [[nodiscard]] at::Tensor decode(const at::Tensor& encoded, const at::Tensor& maximum) const override {
    return encoded.to(at::kFloat) / amax_to_scale(maximum, type_, false);
  }
  ACCEL_DECL void gathered(const at::Tensor& parameter, const at::Tensor& encoded, const at::Tensor& maximum) override;
  void released(const at::Tensor& parameter) override {
    if (auto* plan = layers_->plan_of(parameter)) plan->gathered.reset();
  }

 private:
  std::shared_ptr<layer_table> layers_;
  c10::ScalarType type_;
};

/// With the float8 all-gather a converted weight holds its float8 values while gathered (divided by the scale), so
/// a weight that another module of `model` holds too (tied) would compute there with them rather than with the
/// weight: refused, naming both.
ACCEL_DECL void refuse_tied_gathered_weights(torch::nn::Module& model, const layer_table& layers,
                                             std::string_view policy);

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8

#if ACCEL_HEADER_ONLY
#include "impl/float8_gather.ipp"
#endif
