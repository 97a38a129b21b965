/// \file
/// What construction.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../construction.hpp"

namespace accel::detail {

slicing_construction*& construction_in_progress() noexcept {
  thread_local slicing_construction* current = nullptr;
  return current;
}

slicing_construction::slicing_construction(int rank, int world, std::function<void(torch::nn::Module&)> unit_init)
    : rank_(rank), world_(world), unit_init_(std::move(unit_init)) {
  if (construction_in_progress() != nullptr)
    throw std::logic_error(
        "accel::construct_sharded: called inside another sharded construction; build the whole model in one");
  construction_in_progress() = this;
}

std::vector<constructed_slice> slicing_construction::slice_unit(torch::nn::Module& module) {
  if (unit_init_) initialise(module);
  at::NoGradGuard no_grad;
  std::vector<constructed_slice> slices;
  for (const auto& item : module.named_parameters()) {
    const auto& p = item.value();
    if (!p.requires_grad() || sliced_.contains(p.unsafeGetTensorImpl())) continue;
    refuse_shared_storage(item.key(), p);
    const auto span = shard_span_of(p.numel(), rank_, world_);
    slices.push_back({p, p.detach().reshape({-1}).narrow(0, span.begin, span.length).clone()});
    sliced_.insert(p.unsafeGetTensorImpl());
  }
  for (const auto& kept : slices) free_storage(kept.parameter);
  return slices;
}

void slicing_construction::initialise(torch::nn::Module& module) {
  for (const auto& p : module.parameters())
    if (sliced_.contains(p.unsafeGetTensorImpl()))
      throw std::invalid_argument(
          "accel::construct_sharded: a per-unit initialiser cannot run on a shard unit that holds another shard "
          "unit (whose parameters are sliced already); nest no units, or initialise in the module's constructor");
  unit_init_(module);
}

void slicing_construction::refuse_shared_storage(const std::string& name, const at::Tensor& p) {
  const auto bytes = static_cast<std::size_t>(p.numel()) * p.element_size();
  if (p.storage_offset() != 0 || p.storage().nbytes() != bytes || !p.is_contiguous())
    throw std::invalid_argument("accel::construct_sharded: the parameter " + name +
                                " of a shard unit shares its storage with other tensors (or is not contiguous), so "
                                "its bytes cannot be let go alone; give it storage of its own");
}

}  // namespace accel::detail
