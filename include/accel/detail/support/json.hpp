/// \file
/// Writing JSON strings: shared by the safetensors header, the shard index, and the trackers' files.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace accel::detail {

/// `text` as a JSON string literal: quotes and backslashes escaped, control characters as \u00XX.
inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace accel::detail
