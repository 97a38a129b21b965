/// \file
/// Building messages: lists ("a, b, c"), the first line of another error's.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <string>
#include <string_view>

#include "../config.hpp"

namespace accel::detail {

/// Appends `item` to `list`, after `separator` unless the list is empty. (Appending in place also avoids GCC 12's
/// false -Wstringop-overflow on `(empty ? "" : ", ") + item`.)
ACCEL_DECL void append_item(std::string& list, std::string_view item, std::string_view separator = ", ");

/// An error's message without what follows its first line (LibTorch's backtraces).
inline std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/text.ipp"
#endif
