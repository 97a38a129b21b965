/// \file
/// What shard.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../shard.hpp"

namespace accel::detail {

void validate(const shard_options& o, bool size_from_first_batch) {
  if (o.num_processes < 1)
    throw std::invalid_argument("accel::shard_options: num_processes = " + std::to_string(o.num_processes) +
                                " must be at least 1");
  if (o.process_index < 0 || o.process_index >= o.num_processes)
    throw std::out_of_range("accel::shard_options: process_index = " + std::to_string(o.process_index) +
                            " is not a process of " + std::to_string(o.num_processes) + " (0 to " +
                            std::to_string(o.num_processes - 1) + ")");
  if (o.batch_size && *o.batch_size < 1)
    throw std::invalid_argument("accel::shard_options: batch_size = " + std::to_string(*o.batch_size) +
                                " must be at least 1 (or left empty for batches of varying size)");
  if (o.split_batches && !o.batch_size && !size_from_first_batch)
    throw std::invalid_argument(
        "accel::shard_options: split_batches needs batch_size, to cut every batch into num_processes equal parts");
  if (o.split_batches && o.batch_size && *o.batch_size % o.num_processes != 0)
    throw std::invalid_argument("accel::shard_options: split_batches needs batch_size (" +
                                std::to_string(*o.batch_size) + ") to be a multiple of num_processes (" +
                                std::to_string(o.num_processes) +
                                "); choose another batch size, or shard whole batches (split_batches = false)");
}

std::pair<std::int64_t, std::int64_t> part_bounds(std::int64_t size, int process, int processes) {
  const auto per = size / processes, extra = size % processes;
  const auto start = process * per + std::min<std::int64_t>(process, extra);
  return {start, start + per + (process < extra ? 1 : 0)};
}

at::Tensor split_between_processes(const at::Tensor& data, int process, int processes, bool pad) {
  const auto [start, stop] = part_bounds(data.size(0), process, processes);
  auto part = data.narrow(0, start, stop - start);
  const auto longest = (data.size(0) + processes - 1) / processes;
  if (pad && data.size(0) > 0 && part.size(0) < longest) {
    auto last = data.narrow(0, data.size(0) - 1, 1);  // Accelerate pads tensors with the input's last element
    std::vector<std::int64_t> repeats(static_cast<std::size_t>(data.dim()), 1);
    repeats[0] = longest - part.size(0);
    part = at::cat({part, last.repeat(repeats)});
  }
  return part;
}
}  // namespace accel::detail

namespace accel::views {

shard_closure shard(const shard_options& options) {
  detail::validate(options);
  return {options};
}

}  // namespace accel::views
