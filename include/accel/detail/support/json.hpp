/// \file
/// Writing JSON strings (shared by the safetensors header, the shard index, and the trackers' files), and the
/// UTF-8 of a \u escape (shared by the readers of JSON: the safetensors header, MLflow's answers).
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

/// Appends the UTF-8 bytes of `code`, a \uXXXX escape's code unit (surrogates are written as they come, as three
/// bytes each).
inline void append_utf8(std::string& out, unsigned long code) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

}  // namespace accel::detail
