/// \file
/// `accel::batch_range`: what `prepare` and the data layer accept as a range of batches, and the `begin`/`end`/`size`
/// lookup (member or free function) they use on it. No LibTorch header: the data layer and the adapters share it.
#pragma once

#include <concepts>
#include <iterator>
#include <type_traits>
#include <utility>

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
    } && requires(decltype(detail::adl::range_begin(std::declval<std::remove_reference_t<R>&>())) it,
                  const decltype(detail::adl::range_end(std::declval<std::remove_reference_t<R>&>())) end) {
      ++it;
      *it;
      { it != end } -> std::convertible_to<bool>;
    };

}  // namespace accel
