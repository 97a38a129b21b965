/// \file
/// `prepared_range`: what `accelerator::prepare` returns for a range of batches. Iterating it yields the user's
/// batches moved to the accelerator's device, one batch in flight, without copying the underlying range.
///
/// Any range with `begin()`/`end()` works, including LibTorch's data loaders, whose iterators are not C++20
/// iterators (`operator*` is non-const, there is no `it++`): the prepared range only uses `++it`, `*it` and
/// `it != end` on them, and its own iterator is a proper `std::input_iterator`.
#pragma once

#include <c10/core/Device.h>

#include <concepts>
#include <cstddef>
#include <iterator>
#include <optional>
#include <type_traits>
#include <utility>

#include "detail/prepared_handle.hpp"
#include "detail/stored.hpp"
#include "device.hpp"

namespace accel {
namespace detail::adl {
using std::begin;
using std::end;
using std::size;
template <class R>
auto range_begin(R& r) -> decltype(begin(r)) {
  return begin(r);
}
template <class R>
auto range_end(R& r) -> decltype(end(r)) {
  return end(r);
}
template <class R>
auto range_size(const R& r) -> decltype(size(r)) {
  return size(r);
}
}  // namespace detail::adl

/// A range of batches `prepare` accepts: `begin(r)`/`end(r)` (member or free) with an iterator that has `++it`,
/// `*it` and `it != end`.
template <class R>
concept batch_range =
    requires(std::remove_reference_t<R>& r) {
      detail::adl::range_begin(r);
      detail::adl::range_end(r);
    } &&
    requires(decltype(detail::adl::range_begin(std::declval<std::remove_reference_t<R>&>())) it,
             const decltype(detail::adl::range_end(std::declval<std::remove_reference_t<R>&>())) end) {
      ++it;
      *it;
      { it != end } -> std::convertible_to<bool>;
    };

/// `Range` is `R&` when the user passed an lvalue (kept by reference) or `R` for an rvalue (owned).
template <class Range, class Accelerator>
  requires batch_range<Range>
class prepared_range : detail::prepared_tag {
  using base_range = std::remove_reference_t<Range>;
  using base_iterator = decltype(detail::adl::range_begin(std::declval<base_range&>()));
  using base_sentinel = decltype(detail::adl::range_end(std::declval<base_range&>()));

 public:
  /// What iterating yields: the underlying batch type, as values (see `placed_t`).
  using batch_type = placed_t<decltype(*std::declval<base_iterator&>())>;

  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    iterator(base_iterator base, base_sentinel end, std::optional<c10::Device> device)
        : base_(std::move(base)), end_(std::move(end)), device_(device) {
      load();
    }

    /// The current batch, already on the device.
    batch_type& operator*() const noexcept { return *batch_; }
    iterator& operator++() {
      ++base_;
      load();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept { return !it.batch_.has_value(); }

   private:
    void load() {
      if (base_ != end_)
        batch_.emplace(device_ ? send_to_device(*base_, *device_) : batch_type(*base_));
      else
        batch_.reset();
    }

    base_iterator base_;
    base_sentinel end_;
    std::optional<c10::Device> device_;  // empty when device placement is off
    mutable std::optional<batch_type> batch_;
  };

  prepared_range(Range&& range, Accelerator& accelerator)
      : range_(std::forward<Range>(range)),
        device_(accelerator.device_placement() ? std::optional<c10::Device>(accelerator.device()) : std::nullopt) {}

  /// Starts a pass over the underlying range (a LibTorch loader starts a new epoch here).
  [[nodiscard]] iterator begin() const {
    auto& range = range_.get();
    return iterator(detail::adl::range_begin(range), detail::adl::range_end(range), device_);
  }
  [[nodiscard]] static constexpr std::default_sentinel_t end() noexcept { return {}; }

  /// Number of batches, when the underlying range knows it.
  [[nodiscard]] auto size() const
    requires requires(const base_range& r) { detail::adl::range_size(r); }
  {
    return detail::adl::range_size(std::as_const(range_.get()));
  }

  /// The user's range.
  [[nodiscard]] base_range& unwrap() const noexcept { return range_.get(); }

 private:
  mutable detail::stored<Range> range_;
  std::optional<c10::Device> device_;
};

}  // namespace accel
