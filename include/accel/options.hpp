/// \file
/// `accel::options`: the run-time knobs of an accelerator. Decisions that change the generated code are
/// template arguments (the policies); everything here is read once, at construction.
#pragma once

#include "fwd.hpp"

namespace accel {

/// Plain aggregate, so that `accel::accelerator<> acc{{.cpu = true}};` reads as configuration.
struct options {
  /// Run on the CPU even when CUDA is available (Accelerate's `cpu=True`).
  bool cpu = false;
  /// Let `prepare()` move models and batches to `device()` (Accelerate's `device_placement`). Turn it off when
  /// the program places tensors itself.
  bool device_placement = true;
};

}  // namespace accel
