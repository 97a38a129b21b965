/// \file
/// What storage.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../storage.hpp"

namespace accel::detail {

void free_storage(const at::Tensor& tensor) {
  auto* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}

void reallocate_storage(const at::Tensor& tensor) {
  auto* storage = tensor.storage().unsafeGetStorageImpl();
  const auto bytes = static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace accel::detail
