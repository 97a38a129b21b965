/// \file
/// The accelerator configurations that accel::compiled instantiates once (src/accelerators.cpp): in separate
/// compilation, accelerator.hpp (the basic ones) and accel.hpp (the sharded ones, whose policies accelerator.hpp does
/// not include) declare them `extern template`, so that a file using one does not instantiate the accelerator's
/// members again. Other configurations are instantiated where they are used, as in header-only mode.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

// X(precision, parallel), each with no_accumulation.
#define ACCEL_BASIC_CONFIGURATIONS(X) \
  X(fp32, single_process)             \
  X(bf16, single_process)             \
  X(fp32, data_parallel<gloo>)        \
  X(bf16, data_parallel<gloo>)
#define ACCEL_SHARDED_CONFIGURATIONS(X) \
  X(fp32, zero1<gloo>)                  \
  X(bf16, zero1<gloo>)                  \
  X(fp32, zero2<gloo>)                  \
  X(bf16, zero2<gloo>)                  \
  X(fp32, fully_sharded<gloo>)          \
  X(bf16, fully_sharded<gloo>)          \
  X(fp32, hybrid_sharded<gloo>)         \
  X(bf16, hybrid_sharded<gloo>)

#define ACCEL_EXTERN_CONFIGURATION(precision, parallel) \
  extern template class accelerator<precision, parallel, no_accumulation>;
#define ACCEL_INSTANTIATE_CONFIGURATION(precision, parallel) \
  template class accelerator<precision, parallel, no_accumulation>;
