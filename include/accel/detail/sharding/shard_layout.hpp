/// \file
/// How a sharded policy splits a parameter: on its flattened elements, in chunks of ceil(n / P), process r owning
/// elements [r * chunk, (r + 1) * chunk) (possibly none of a small parameter). The gradient reducer (zero2,
/// fully_sharded) and the optimizer's shards both lay buckets out with it, so that process r's slices of every
/// parameter of a bucket are one contiguous segment, the r-th, of the bucket (DeepSpeed's coalesced layout): one
/// reduce-scatter or all-gather per bucket then gives each process its segment.
// IWYU pragma: private, include <accel/sharded_data_parallel.hpp>
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../config.hpp"

namespace accel {
/// What a sharded policy holds of a parameter on this process (`shard_of`, a parallel policy hook): its slice
/// (flat, its current values), the full parameter's shape, and where the slice begins in the flattened parameter.
struct parameter_shard {
  at::Tensor slice;
  std::vector<std::int64_t> sizes;
  std::int64_t begin = 0;
};
}  // namespace accel

namespace accel::detail {

/// The elements [begin, begin + length) of a flattened parameter that one process owns.
struct shard_span {
  std::int64_t begin = 0;
  std::int64_t length = 0;
};

/// Elements each process's slice of `numel` takes in a bucket segment: ceil(numel / world), padded where a process
/// owns fewer.
inline std::int64_t shard_chunk(std::int64_t numel, int world) { return (numel + world - 1) / world; }

/// Process `rank`'s span of `numel` elements split over `world` processes in chunks of ceil(numel / world).
ACCEL_DECL shard_span shard_span_of(std::int64_t numel, int rank, int world);

/// Whether a parallel policy's gradient reducer all-reduces full gradients (data_parallel, zero1) or
/// reduce-scatters them so that each process keeps its shard only (zero2 and up).
enum class gradient_layout { replicated, sharded };

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/shard_layout.ipp"
#endif
