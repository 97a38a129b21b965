// expect-error: accel::fp8 needs LibTorch 2.4 or newer: the float8 types and at::_scaled_mm do not exist in this LibTorch
// What naming accel::fp8 says on LibTorch 1.13 (ACCEL_HAS_FLOAT8 false): the check is a template over the version, so
// that this test states it on any LibTorch.
#include <accel/fp8.hpp>
constexpr auto size = sizeof(accel::detail::require_float8<113>);  // needs the type complete: instantiates it
