/// \file
/// Accumulation policies: how many micro-batches make one optimizer step.
///
/// Available policies / when to use:
/// - `accel::no_accumulation` (= `accel::accumulate<1>`): every batch steps. Costs nothing: no counter, no branch.
/// - `accel::accumulate<N>`: N micro-batches per step, known at compile time (issue #4).
/// - `accel::accumulate_dynamic`: N read at run time (issue #4).
#pragma once

#include <ATen/core/Tensor.h>

#include "concepts.hpp"
#include "detail/diagnostics.hpp"
#include "options.hpp"

namespace accel {

/// `N` micro-batches per optimizer step. `accumulate<1>` is `no_accumulation`: every hook is a constant.
template <int N>
struct accumulate {
  static_assert(N >= 1, "accel::accumulate<N>: N counts micro-batches per optimizer step and must be at least 1");
  using policy_category = accumulation_tag;

  constexpr explicit accumulate(const options&) noexcept {
    static_assert(N == 1,
                  "accel::accumulate<N> for N > 1 lands with issue #4 (gradient accumulation); use "
                  "accel::no_accumulation until then");
  }

  [[nodiscard]] static constexpr int steps() noexcept { return N; }
  /// With one micro-batch per step, every step synchronises.
  [[nodiscard]] static constexpr bool sync_gradients() noexcept { return true; }
  /// With one micro-batch per step, the loss is used as it is (no division, no copy).
  [[nodiscard]] static constexpr const at::Tensor& scale_loss(const at::Tensor& loss) noexcept { return loss; }
};

/// N micro-batches per step, N chosen at run time. Declared here so configurations name it; it lands with
/// issue #4.
struct accumulate_dynamic {
  using policy_category = accumulation_tag;

  template <class Options>
  explicit accumulate_dynamic(const Options&) {
    static_assert(detail::always_false<Options>,
                  "accel::accumulate_dynamic lands with issue #4 (gradient accumulation); use accel::no_accumulation "
                  "until then");
  }
  int steps() const;
  bool sync_gradients() const;
  at::Tensor scale_loss(const at::Tensor& loss) const;
};

}  // namespace accel
