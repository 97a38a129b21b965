/// \file
/// `accel::gradient_state`: where the data stands for gradient synchronisation (Accelerate's `GradientState`):
/// whether a prepared range is yielding its pass's last batch, and how much of the last global batch is real.
/// The micro-step count itself belongs to the accumulation policy.
#pragma once

#include <cstdint>

namespace accel {

struct gradient_state {
  /// True while a prepared range yields its last batch: accumulation synchronises, `gather_for_metrics` trims.
  bool end_of_dataloader = false;
  /// Samples of the last global batch that are real (the rest was padded by `even_batches`); -1: none padded.
  std::int64_t remainder = -1;
};

}  // namespace accel
