/// \file
/// `batch_channel`: how a batch gets from process 0 to every process under `options::dispatch_batches`. The data
/// layer (accel/shard.hpp) sends through it without knowing the communicator; accel/collectives.hpp implements it
/// with a broadcast.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <optional>

namespace accel::detail {

template <class Batch>
struct batch_channel {
  virtual ~batch_channel() = default;
  /// Process 0 passes its batch (nullopt: its input has ended); every process gets process 0's back. A collective.
  virtual std::optional<Batch> from_main(std::optional<Batch> batch) = 0;
};

}  // namespace accel::detail
