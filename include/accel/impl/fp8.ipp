/// \file
/// What fp8.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../fp8.hpp"

#if ACCEL_HAS_FLOAT8

namespace accel::detail::fp8 {

fp8_format format_for(scaling kind, const fp8_options& options, std::string_view policy) {
  if (kind != scaling::rowwise) return options.fp8_format.value_or(fp8_format::hybrid);
  if (options.fp8_format.value_or(fp8_format::e4m3) != fp8_format::e4m3)
    throw std::invalid_argument(std::string(policy) +
                                " casts every operand to e4m3 (torchao's rowwise recipe; CUDA's rowwise kernel takes "
                                "nothing else): leave options.fp8.fp8_format unset or set it to fp8_format::e4m3");
  return fp8_format::e4m3;
}

void check_float8_all_gather(scaling kind, const fp8_options& options, std::string_view policy) {
  if (options.enable_fsdp_float8_all_gather && kind != scaling::tensorwise)
    throw std::invalid_argument(
        std::string(policy) +
        ": options.fp8.enable_fsdp_float8_all_gather casts each weight's slices with the scale of the whole weight's "
        "current amax, which is tensorwise dynamic scaling (torchao supports the float8 all-gather for that recipe "
        "only); use accel::fp8<accel::tensorwise_scaling> (accel::fp8<>), or leave the option false");
}

}  // namespace accel::detail::fp8

#endif  // ACCEL_HAS_FLOAT8
