/// \file
/// Letting go of a tensor's bytes while the tensor stays a valid handle of its shape: how fully_sharded frees the
/// full parameters between uses (owned_shards.hpp) and how a sharded construction lets go of a unit's whole
/// parameters once it has kept its slices (construction.hpp).
// IWYU pragma: private, include <accel/sharded_data_parallel.hpp>
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstddef>

#include "../config.hpp"

namespace accel::detail {

/// Frees `tensor`'s storage, keeping the storage object, so that the tensor and its views stay valid handles (FSDP's
/// way of letting go of parameters that autograd saved for backward).
ACCEL_DECL void free_storage(const at::Tensor& tensor);
/// Gives a contiguous `tensor` whose storage `free_storage` freed its bytes again (uninitialised).
ACCEL_DECL void reallocate_storage(const at::Tensor& tensor);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/storage.ipp"
#endif
