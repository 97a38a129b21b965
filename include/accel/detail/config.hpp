/// \file
/// How accel's code that is not a template is compiled, as Asio and spdlog do it:
///   - header-only (the default, CMake target `accel::accel`): every header includes the definitions of what it
///     declares (`impl/*.ipp`), marked `inline`; nothing to link;
///   - separately (`ACCEL_SEPARATE_COMPILATION`, which the CMake target `accel::compiled` defines for its users): the
///     headers declare only, and the definitions are compiled once into the `accel::compiled` library
///     (`src/accel.cpp`), with the common accelerator configurations instantiated there (`extern template` in the
///     headers). A program is built one way or the other, never both: the two modes' symbols differ in linkage.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#if defined(ACCEL_SEPARATE_COMPILATION)
#define ACCEL_HEADER_ONLY 0
#define ACCEL_DECL
#else
#define ACCEL_HEADER_ONLY 1
#define ACCEL_DECL inline
#endif
