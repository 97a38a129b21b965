/// \file
/// `stored<T>`: how a prepared object holds what the user gave it. An lvalue is referred to (the user keeps
/// it, as `std::views::all` does); an rvalue is moved in and owned.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <memory>
#include <utility>

namespace accel::detail {

template <class T>
class stored {
 public:
  explicit stored(T&& value) : value_(std::move(value)) {}
  T& get() noexcept { return value_; }
  const T& get() const noexcept { return value_; }

 private:
  T value_;
};

template <class T>
class stored<T&> {
 public:
  explicit stored(T& value) noexcept : pointer_(std::addressof(value)) {}
  T& get() const noexcept { return *pointer_; }

 private:
  T* pointer_;
};

}  // namespace accel::detail
