/// \file
/// `stored<T>`: how a view holds what the user gave it. An lvalue is referred to (the user keeps it, as
/// `std::views::all` does); an rvalue is moved in and owned. `pinned<T>` owns an rvalue on the heap instead, so that
/// it never moves: what a prepared object registered with its accelerator stays valid when the prepared object moves.
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

template <class T>
class pinned {
 public:
  explicit pinned(T&& value) : value_(std::make_unique<T>(std::move(value))) {}
  T& get() const noexcept { return *value_; }

 private:
  std::unique_ptr<T> value_;
};

template <class T>
class pinned<T&> : public stored<T&> {
 public:
  using stored<T&>::stored;
};

}  // namespace accel::detail
