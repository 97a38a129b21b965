/// \file
/// Compile-time diagnostics: a constraint that fails with a sentence. g++ and clang print the source of the
/// failing constraint, so putting the message in it gives the user a readable error instead of a trace.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <cstddef>
#include <type_traits>

namespace accel::detail {

/// A string usable as a template argument.
template <std::size_t N>
struct message {
  char text[N];
  consteval message(const char (&s)[N]) {  // NOLINT: implicit on purpose, so "..." converts
    for (std::size_t i = 0; i < N; ++i) text[i] = s[i];
  }
};

/// Always false; used as the last operand of a disjunction so that the failing constraint, printed by the
/// compiler, carries `Message` and the offending types.
template <message Message, class... Offending>
consteval bool unsatisfied() {
  return false;
}

/// For `static_assert`s that must only fire when a template is instantiated.
template <class...>
inline constexpr bool always_false = false;

}  // namespace accel::detail
