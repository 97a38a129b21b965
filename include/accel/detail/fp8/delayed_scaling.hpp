/// \file
/// TransformerEngine's delayed scaling (`DelayedScaling`): each float8 tensor is cast with a scale computed from the
/// amaxes of earlier steps, and its own amax is recorded for later ones.
// IWYU pragma: private, include <accel/fp8.hpp>
#pragma once

#include "../config.hpp"
#include "../compat.hpp"  // ACCEL_HAS_FLOAT8: on a LibTorch without float8 this header declares nothing

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_FLOAT8

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../options.hpp"

namespace accel::detail::fp8 {

/// The amax histories and scales of every tensor a policy casts with delayed scaling, one column each
/// (TransformerEngine's `amax_history` [length, tensors] and `scale` [tensors], float32). TransformerEngine's rules:
/// - a cast uses its column's scale as it is (1 at first) and records the tensor's amax in row 0 (the largest of
///   the amaxes since the last update: several forwards of an accumulation window, or evaluation passes, share it);
/// - `update` takes each column's amax (the largest of its history, or row 0 with `most_recent`), sets the scale
///   to (largest float8 value / amax) / 2^margin where that amax is positive and finite (else the scale stays; an
///   infinite result is float32's largest value), then
///   rolls the history by one row towards 0 (row 0 goes to the end) and zeroes row 0, so that an amax counts in the
///   next `length` updates and then drops out of the window.
class amax_history {
 public:
  ACCEL_DECL amax_history(const fp8_options& options, c10::Device device);

  /// Adds a column for a tensor cast to a type whose largest value is `largest_value` (scale 1, empty history);
  /// returns its index. At prepare, before any cast: it reallocates.
  ACCEL_DECL int add(double largest_value);

  /// The scale column `column` is cast with now (a view: it follows updates).
  [[nodiscard]] at::Tensor scale(int column) const { return scale_[column]; }
  /// Row 0's entry of `column` (a view), where a cast records its amax.
  [[nodiscard]] at::Tensor slot(int column) const { return history_[0][column]; }
  /// Records `amax` (a float32 scalar) in `slot`: the largest since the last update.
  static void record(const at::Tensor& slot, const at::Tensor& amax) {
    slot.copy_(at::maximum(slot, amax.to(at::kFloat)));
  }

  /// Row 0, what the processes reduce with a max before `update` (TransformerEngine's `reduce_amax`).
  [[nodiscard]] at::Tensor current() const { return history_[0]; }

  /// New scales from the histories, then the window moves on (see the class comment). In place: the views handed out
  /// stay valid.
  ACCEL_DECL void update();

  [[nodiscard]] const at::Tensor& history() const noexcept { return history_; }
  [[nodiscard]] const at::Tensor& scales() const noexcept { return scale_; }
  /// Whether a checkpoint's state has this one's shapes; `assign` then copies it in place.
  [[nodiscard]] bool fits(const at::Tensor& history, const at::Tensor& scales) const {
    return history.sizes() == history_.sizes() && scales.sizes() == scale_.sizes();
  }
  ACCEL_DECL void assign(const at::Tensor& history, const at::Tensor& scales);

 private:
  ACCEL_DECL static const fp8_options& checked(const fp8_options& options);

  amax_compute_algo algorithm_;
  int margin_;
  at::Tensor history_;
  at::Tensor scale_;
  at::Tensor largest_;  // each column's largest float8 value
};

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8

#if ACCEL_HEADER_ONLY
#include "impl/delayed_scaling.ipp"
#endif
