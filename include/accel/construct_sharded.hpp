/// \file
/// `accel::construct_sharded(acc, build)`: builds a model for `accel::fully_sharded` without any process holding it
/// whole (FSDP's meta-device initialisation, Accelerate's `init_empty_weights` for training). `build` runs as it
/// would anywhere; each `accel::shard_unit` built inside it keeps this process's slice of each of its trainable
/// parameters as soon as it is built, and lets the whole parameters go before the next unit is built:
///
///     accel::set_seed(42);  // the same on every process: each builds the same initialisation, keeps its slices
///     auto net = accel::construct_sharded(acc, [] { return Net(/*blocks=*/24); });
///     torch::optim::AdamW optimizer(net->parameters());
///     auto [model, opt] = acc.prepare(net, optimizer);  // takes the slices: nothing whole is gathered or broadcast
///
/// A process then holds, at most, its slices of the units built so far, one unit whole, and the parameters outside
/// any unit (built whole, as always). Each unit is built and initialised whole, in the model's order, so with the
/// same seed the parameters are bit for bit those of building the model whole and sharding it at prepare: any
/// initialiser that runs in a unit's constructor works. An initialiser applied to the whole model after it is built
/// (`net->apply(init)`) cannot: the units' parameters hold nothing by then. Give it as `unit_init` (FSDP's
/// `param_init_fn`): it runs on each unit's module once that is built, before its slices are kept, in the model's
/// order (so it draws from the generator as the whole-model `apply` would only where the units are all the model).
///
/// Between `construct_sharded` and `prepare`, the units' parameters keep their full shape over storage of 0 bytes:
/// read or write them only through the prepared model. Prepare the model with the optimizer that trains them
/// (`acc.prepare(model, optimizer)`); a forward before that is refused.
#pragma once

#include <torch/nn/module.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "detail/sharding/construction.hpp"
#include "detail/support/generators.hpp"

namespace accel {
namespace detail {

/// Whether the parallel policy `P` prepares a model whose units hold this process's slices only (fully_sharded).
template <class P>
concept takes_constructed_slices = requires { requires P::takes_constructed_slices; };

/// Every process must start from the same CPU generator: each builds the same initialisation and keeps its own
/// slices of it, and no broadcast at prepare makes them agree afterwards. One all-gather of a digest of the
/// generator's state (8 bytes a process).
template <class Accelerator>
void check_same_generator(Accelerator& acc) {
  if (acc.num_processes() == 1) return;
  auto generator = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard lock(generator.mutex());
    state = generator.get_state();
  }
  const std::string_view bytes(static_cast<const char*>(state.data_ptr()), static_cast<std::size_t>(state.nbytes()));
  const auto digest = static_cast<std::int64_t>(std::hash<std::string_view>{}(bytes));
  const auto all = acc.gather(at::full({1}, digest, at::TensorOptions().dtype(at::kLong).device(acc.device()))).cpu();
  for (int r = 1; r < acc.num_processes(); ++r)
    if (all[r].template item<std::int64_t>() != all[0].template item<std::int64_t>())
      throw std::invalid_argument(
          "accel::construct_sharded: process " + std::to_string(r) +
          "'s random generator differs from process 0's, so their slices would come from different initialisations; "
          "seed every process alike before it (accel::set_seed(seed), without device_specific)");
}

}  // namespace detail

/// Runs `build` (which returns the model) so that each `accel::shard_unit` built in it keeps only this process's
/// slices of its parameters; `unit_init`, when given, initialises each unit's module first. See the file comment.
template <class Accelerator, class Build>
[[nodiscard]] auto construct_sharded(Accelerator& acc, Build&& build,
                                     std::function<void(torch::nn::Module&)> unit_init = {}) {
  static_assert(detail::takes_constructed_slices<typename Accelerator::parallel_type>,
                "accel::construct_sharded builds a model for accel::fully_sharded (its shard units sliced as they are "
                "built); this accelerator's parallel policy does not prepare such a model: build the model whole");
  detail::check_same_generator(acc);
  const auto [index, count] = acc.parallel().construction_slice();  // hybrid sharding: the dp_shard group's
  detail::slicing_construction construction(index, count, std::move(unit_init));
  return std::forward<Build>(build)();
}

}  // namespace accel
