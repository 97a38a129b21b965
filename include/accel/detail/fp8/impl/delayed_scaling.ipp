/// \file
/// What delayed_scaling.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../delayed_scaling.hpp"

#include <limits>

#if ACCEL_HAS_FLOAT8

namespace accel::detail::fp8 {

amax_history::amax_history(const fp8_options& options, c10::Device device)
    : algorithm_(options.amax_compute_algo),
      margin_(checked(options).margin),
      history_(at::zeros({options.amax_history_len, 0}, at::TensorOptions().dtype(at::kFloat).device(device))),
      scale_(at::ones({0}, history_.options())),
      largest_(at::ones({0}, history_.options())) {}

int amax_history::add(double largest_value) {
  history_ = at::cat({history_, at::zeros({history_.size(0), 1}, history_.options())}, 1);
  scale_ = at::cat({scale_, at::ones({1}, scale_.options())});
  largest_ = at::cat({largest_, at::full({1}, largest_value, largest_.options())});
  return static_cast<int>(scale_.size(0)) - 1;
}

void amax_history::update() {
  if (scale_.size(0) == 0) return;
  const auto amax = algorithm_ == amax_compute_algo::max ? std::get<0>(history_.max(0)) : history_[0].clone();
  auto computed = at::div(largest_, amax) / std::ldexp(1.0, margin_);
  computed = at::where(amax > 0, computed, scale_);
  computed = at::where(at::isfinite(amax), computed, scale_);
  // An amax positive but tiny (below largest / float32's max: 1.3e-36 for e4m3) gives an infinite scale, which
  // turns every zero it multiplies into NaN: float32's largest finite value instead, as TransformerEngine does.
  computed = at::where(at::isinf(computed), at::full_like(computed, std::numeric_limits<float>::max()), computed);
  scale_.copy_(computed);
  history_.copy_(at::roll(history_, {-1}, {0}));
  history_[0].zero_();
}

void amax_history::assign(const at::Tensor& history, const at::Tensor& scales) {
  history_.copy_(history);
  scale_.copy_(scales);
}

const fp8_options& amax_history::checked(const fp8_options& options) {
  if (options.amax_history_len < 1)
    throw std::invalid_argument("accel::fp8: options.fp8.amax_history_len must be at least 1, not " +
                                std::to_string(options.amax_history_len));
  if (options.margin < 0)
    throw std::invalid_argument("accel::fp8: options.fp8.margin must be 0 or more, not " +
                                std::to_string(options.margin));
  return options;
}

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8
