/// \file
/// Building lists in messages and headers ("a, b, c").
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <string>
#include <string_view>

namespace accel::detail {

/// Appends `item` to `list`, after `separator` unless the list is empty. (Appending in place also avoids GCC 12's
/// false -Wstringop-overflow on `(empty ? "" : ", ") + item`.)
inline void append_item(std::string& list, std::string_view item, std::string_view separator = ", ") {
  if (!list.empty()) list += separator;
  list += item;
}

}  // namespace accel::detail
