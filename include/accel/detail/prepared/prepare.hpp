/// \file
/// What `accelerator::prepare` does with each argument: a model placed and given to the policies, an optimizer and
/// a scheduler adapted, a range of batches sharded for this process. Free functions over the accelerator's public
/// members and the one door (`accelerator_access`), so that the class holds its interface, not this dispatch.
// IWYU pragma: private, include <accel/accelerator.hpp>
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "../../batch_range.hpp"
#include "../../collectives.hpp"
#include "../../data_loader.hpp"
#include "../../parallel.hpp"
#include "../../prepared_model.hpp"
#include "../../prepared_optimizer.hpp"
#include "../../prepared_range.hpp"
#include "../../prepared_scheduler.hpp"
#include "../../shard.hpp"
#include "../support/diagnostics.hpp"
#include "accelerator_access.hpp"
#include "prepared_handle.hpp"

namespace accel::detail {

template <class T>
inline constexpr bool is_prepared_model = false;
template <class M, class A>
inline constexpr bool is_prepared_model<prepared_model<M, A>> = true;

/// The module of a model handle or of a prepared model.
template <class Model>
const torch::nn::Module& module_of(const Model& model) {
  if constexpr (is_prepared_model<Model>)
    return *model;
  else
    return *module_pointer(model);
}

/// dispatch_batches reads a range of batches on process 0; a data loader is prepared by its own rule.
template <class Accelerator>
void refuse_dispatch(const Accelerator& acc, const char* what) {
  if (acc.options().dispatch_batches)
    throw std::invalid_argument(std::string("accel: options::dispatch_batches cannot dispatch ") + what +
                                " at prepare; to have process 0 alone read it and send its batches, prepare "
                                "std::ranges::ref_view(loader) (a plain range of its batches) instead");
}

/// The broadcast that carries process 0's batches to every process under dispatch_batches.
template <class Batch, class Parallel>
std::shared_ptr<batch_channel<Batch>> dispatch_channel(Parallel& parallel) {
  if constexpr (ivalue_holds<Batch>) {
    static_assert(std::is_lvalue_reference_v<decltype(parallel.communicator())>,
                  "the channel keeps the communicator: it must outlive the prepared range");
    auto& comm = parallel.communicator();
    return std::make_shared<broadcast_channel<std::remove_reference_t<decltype(comm)>, Batch>>(comm);
  } else {
    throw std::invalid_argument(
        "accel: options::dispatch_batches sends each batch from process 0 pickled as a c10::IValue, which cannot "
        "hold this batch type; use batches of tensors, numbers or strings (or vectors, tuples, pairs and "
        "torch::data::Examples of them)");
  }
}

/// Under several processes, a range is sharded first: a data loader's index batches, before loading; any other
/// range's batches themselves.
template <class Accelerator, class Range>
auto prepare_range(Accelerator& acc, Range&& range) {
  using type = std::remove_cvref_t<Range>;
  if constexpr (always_one_process<typename Accelerator::parallel_type>) {
    return prepared_range<Range, Accelerator>(std::forward<Range>(range), acc);
  } else if constexpr (is_stream_loader<type>) {
    refuse_dispatch(acc, "a stream loader (an accel::data_loader over a range without a size)");
    using sharded = sharded_stream<Range>;
    return prepared_range<sharded, Accelerator>(
        sharded(std::forward<Range>(range), accelerator_access::shard_options_here(acc)), acc);
  } else if constexpr (is_data_loader<type>) {
    refuse_dispatch(acc, "an accel::data_loader, which already loads only each process's own samples,");
    using sharded = sharded_loader<Range>;
    return prepared_range<sharded, Accelerator>(
        sharded(std::forward<Range>(range), accelerator_access::shard_options_here(acc)), acc);
  } else {
    using sharded = shard_view<Range>;
    auto sharding = accelerator_access::shard_options_here(acc);
    sharding.batch_size = acc.options().batch_size;
    sharding.drop_last = acc.options().drop_last;
    sharded view(std::forward<Range>(range), sharding, typename sharded::infer_batch_size_t{});
    if (acc.options().dispatch_batches)
      view.dispatch_from_main(dispatch_channel<typename sharded::batch_type>(accelerator_access::parallel(acc)));
    return prepared_range<sharded, Accelerator>(std::move(view), acc);
  }
}

/// One argument of `prepare`, prepared: lvalues referred to, rvalues owned.
template <class Accelerator, class Object>
auto prepare_object(Accelerator& acc, Object&& object) {
  using type = std::remove_cvref_t<Object>;
  static_assert(!is_prepared<type>,
                "accel::accelerator::prepare(): this object is already prepared; use the prepared object as it is");
  if constexpr (model_like<type>) {
    return acc.prepare_model(std::forward<Object>(object));
  } else if constexpr (optimizer_like<Object>) {
    accelerator_access::parallel(acc).prepare_optimizer(object);
    return prepared_optimizer<Object, Accelerator>(std::forward<Object>(object), acc);
  } else if constexpr (scheduler_like<Object>) {
    return prepared_scheduler<Object, Accelerator>(std::forward<Object>(object), acc);
  } else if constexpr (batch_range<Object>) {
    return prepare_range(acc, std::forward<Object>(object));
  } else if constexpr (requires(type& pointer) { requires batch_range<decltype(*pointer)>; }) {
    static_assert(always_false<type>,
                  "accel::accelerator::prepare(): this argument points to a range of batches (such as the "
                  "std::unique_ptr that torch::data::make_data_loader returns); pass the range it points to: "
                  "acc.prepare(*loader)");
  } else {
    static_assert(always_false<type>,
                  "accel::accelerator::prepare() takes models (torch::nn::ModuleHolder or "
                  "std::shared_ptr<torch::nn::Module>), optimizers (torch::optim::Optimizer), LR schedulers "
                  "(anything with step()) and ranges of batches (anything with begin()/end()); this argument is "
                  "none of them");
  }
}

}  // namespace accel::detail
