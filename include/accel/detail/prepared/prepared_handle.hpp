/// \file
/// `prepared_handle`: what every prepared wrapper of a user object shares: the object (referred to, or owned in
/// place: see `pinned`), the accelerator it was prepared by, its registration with it, `->` and `unwrap()`.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <type_traits>
#include <utility>

#include "accelerator_access.hpp"
#include "registry.hpp"
#include "../support/stored.hpp"

namespace accel::detail {

/// Base of the prepared wrappers; derived classes are recognised by `is_prepared`.
struct prepared_tag {};

template <class T>
inline constexpr bool is_prepared = std::is_base_of_v<prepared_tag, std::remove_cvref_t<T>>;

template <class Object, class Accelerator>
class prepared_handle : prepared_tag {
 public:
  using object_type = std::remove_reference_t<Object>;

  [[nodiscard]] object_type* operator->() const noexcept { return &object_.get(); }
  /// The user's object.
  [[nodiscard]] object_type& unwrap() const noexcept { return object_.get(); }

 protected:
  prepared_handle(Object&& object, Accelerator& accelerator)
      : object_(std::forward<Object>(object)), accelerator_(&accelerator) {}

  using access = accelerator_access;

  pinned<Object> object_;
  Accelerator* accelerator_;
  registration registration_;  // what the accelerator holds of this object, for as long as it lives
};

}  // namespace accel::detail
