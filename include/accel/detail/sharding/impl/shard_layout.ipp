/// \file
/// What shard_layout.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../shard_layout.hpp"

namespace accel::detail {

shard_span shard_span_of(std::int64_t numel, int rank, int world) {
  const auto chunk = shard_chunk(numel, world);
  const auto begin = std::min(numel, chunk * rank);
  return {begin, std::min(numel, begin + chunk) - begin};
}

}  // namespace accel::detail
