/// \file
/// Writing JSON strings (shared by the safetensors header, the shard index, and the trackers' files), and the
/// UTF-8 of a \u escape (shared by the readers of JSON: the safetensors header, MLflow's answers).
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include "../config.hpp"

namespace accel::detail {

/// `text` as a JSON string literal: quotes and backslashes escaped, control characters as \u00XX.
ACCEL_DECL std::string json_string(std::string_view text);

/// Appends the UTF-8 bytes of `code`, a \uXXXX escape's code unit (surrogates are written as they come, as three
/// bytes each).
ACCEL_DECL void append_utf8(std::string& out, unsigned long code);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/json.ipp"
#endif
