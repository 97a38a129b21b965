/// \file
/// The shards of zero1 and zero2: each a view sharing its full parameter's storage, so that the step's in-place
/// update lands in the full parameter, whose other slices an all-gather then fills in.
// IWYU pragma: private, include <accel/sharded_data_parallel.hpp>
#pragma once

#include <cstddef>
#include <functional>

#include "../../collectives.hpp"
#include "optimizer_shards.hpp"

namespace accel::detail {

/// An optimizer's shards as views of the full parameters, which stay full.
class view_shards : public optimizer_shards {
 public:
  template <class IsPrepared>
  view_shards(torch::optim::Optimizer& optimizer, int rank, int world, const bucket_options& limits,
              IsPrepared&& is_prepared)
      : optimizer_shards(optimizer, rank, world, limits, std::forward<IsPrepared>(is_prepared), false, {}) {}

  /// After this process stepped its shards: every process's updated slices, one all-gather per bucket, written into
  /// the full parameters.
  template <communicator C>
  void gather(C& comm) {
    const auto full_elements = [this](std::size_t entry) { return parameters_[entry].full.detach().view({-1}); };
    for (const auto& bucket : buckets_)
      launch_gather(bucket, comm, full_elements, /*own_in_place=*/true, [this](auto& b) { return kept_buffers(b); })();
  }
};

}  // namespace accel::detail
