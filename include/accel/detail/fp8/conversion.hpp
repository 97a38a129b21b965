/// \file
/// Which Linear layers of a model compute in float8 (Accelerate's `filter_first_and_last_linear_layers`, torchao's
/// shape rule), and whether this device's `at::_scaled_mm` takes what a recipe gives it.
// IWYU pragma: private, include <accel/fp8.hpp>
#pragma once

#include "../config.hpp"
#include "../compat.hpp"  // ACCEL_HAS_FLOAT8: on a LibTorch without float8 this header declares nothing

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_FLOAT8
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../../options.hpp"
#include "casts.hpp"
#include "delayed_scaling.hpp"
#include "linear.hpp"

namespace accel::detail::fp8 {

/// A Linear of a model and its name there (`blocks.0.mlp.0`).
struct named_linear {
  std::string name;
  torch::nn::LinearImpl* linear;
};

/// The model's Linear layers in `named_modules` order (the order their modules were registered).
ACCEL_DECL std::vector<named_linear> linears_of(torch::nn::Module& model);

/// torchao's rule: float8 matmuls take dimensions in multiples of 16 (the batch's tokens are padded instead).
ACCEL_DECL bool shape_suits(const torch::nn::LinearImpl& linear);

/// The Linear layers of `model` to compute in float8: those of a suitable shape that `filter` keeps, or without a
/// filter all but the model's first and last Linear (Accelerate's `filter_first_and_last_linear_layers`: "for
/// stability": the embedding side and the logits).
ACCEL_DECL std::vector<named_linear> layers_to_convert(torch::nn::Module& model, const fp8_options& options);

/// Lists `model`'s chosen layers in `table`, each with three columns of `history` under delayed scaling.
ACCEL_DECL void convert(torch::nn::Module& model, const fp8_options& options, scaling kind, fp8_format format,
                        amax_history* history, layer_table& table);

/// Runs one 16 x 16 `at::_scaled_mm` of each pairing the recipe uses (forward: input with weight; backward: the
/// gradient with each), so that a device or LibTorch that cannot (CUDA before compute capability 8.9, rowwise scales
/// before 9.0, e5m2 with e5m2 on CUDA) is refused when the accelerator is built, with LibTorch's reason.
ACCEL_DECL void check_device(const c10::Device& device, scaling kind, fp8_format format, std::string_view policy);

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8

#if ACCEL_HEADER_ONLY
#include "impl/conversion.ipp"
#endif
