/// \file
/// `accel::send_to_device(batch, device)`: moves every tensor of a batch to a device, keeping its structure.
///
/// Handled out of the box: tensors; `std::pair`, `std::tuple`, `std::array` (anything tuple-like); sequence
/// containers such as `std::vector`; maps; `torch::data::Example`; and values with no tensor inside
/// (arithmetic types, enums, strings), which pass through unchanged. Nesting works.
///
/// Customisation point: for a type of your own, specialise `accel::batch_traits`:
/// \code
/// template <> struct accel::batch_traits<my_batch> {
///   static my_batch to_device(const my_batch& b, const torch::Device& d, bool non_blocking) {
///     return {accel::send_to_device(b.pixels, d, non_blocking), b.ids};
///   }
/// };
/// \endcode
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/data/example.h>

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "detail/support/diagnostics.hpp"

namespace accel {

/// Specialise for a batch type accel does not know. The primary template is left undefined on purpose.
template <class T>
struct batch_traits;

namespace detail {
template <class T>
struct placed;
}  // namespace detail

/// The type `send_to_device` returns for a batch of type `T`: `T` itself, except that a tuple-like batch of
/// references (`std::tie`, a zip view's elements) becomes a `std::tuple` of values, since its elements are new
/// tensors that nothing else owns.
template <class T>
using placed_t = typename detail::placed<std::remove_cvref_t<T>>::type;

template <class T>
placed_t<T> send_to_device(const T& batch, const c10::Device& device, bool non_blocking = false);

/// Built in: `torch::data::Example` (with or without a target).
template <class Data, class Target>
struct batch_traits<torch::data::Example<Data, Target>> {
  static torch::data::Example<Data, Target> to_device(const torch::data::Example<Data, Target>& example,
                                                      const c10::Device& device, bool non_blocking) {
    if constexpr (std::is_same_v<Target, torch::data::example::NoTarget>)
      return {send_to_device(example.data, device, non_blocking)};
    else
      return {send_to_device(example.data, device, non_blocking), send_to_device(example.target, device, non_blocking)};
  }
};

namespace detail {

template <class T>
concept has_batch_traits = requires(const T& batch, const c10::Device& device) {
  { batch_traits<T>::to_device(batch, device, false) } -> std::convertible_to<T>;
};

template <class T>
concept tuple_like = requires { std::tuple_size<T>::value; };

template <class T>
concept map_like = requires(T& m, const typename T::key_type& k, const typename T::mapped_type& v) { m.emplace(k, v); };

template <class T>
concept sequence_like = requires(T& c, const typename T::value_type& v) {
  c.begin();
  c.end();
  c.push_back(v);
};

template <class T>
concept passes_through = std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_convertible_v<T, std::string_view>;

template <class T>
struct placed {
  using type = T;
};
template <class T, std::size_t... I>
consteval bool holds_references(std::index_sequence<I...>) {
  return (std::is_reference_v<std::tuple_element_t<I, T>> || ...);
}
template <class T, std::size_t... I>
auto decayed_tuple(std::index_sequence<I...>) -> std::tuple<placed_t<std::tuple_element_t<I, T>>...>;
template <tuple_like T>
  requires(holds_references<T>(std::make_index_sequence<std::tuple_size_v<T>>{}))
struct placed<T> {
  using type = decltype(decayed_tuple<T>(std::make_index_sequence<std::tuple_size_v<T>>{}));
};

template <class T, std::size_t... I>
placed_t<T> tuple_to_device(const T& batch, const c10::Device& device, bool non_blocking, std::index_sequence<I...>) {
  using std::get;
  return placed_t<T>{send_to_device(get<I>(batch), device, non_blocking)...};
}

}  // namespace detail

/// Returns `batch` with every tensor on `device`. A tensor already there is returned as it is, without a call
/// into the dispatcher, so placement costs nothing when the data is already where it belongs.
template <class T>
placed_t<T> send_to_device(const T& batch, const c10::Device& device, bool non_blocking) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    if (!batch.defined() || batch.device() == device) return batch;
    return batch.to(device, non_blocking);
  } else if constexpr (detail::has_batch_traits<T>) {
    return batch_traits<T>::to_device(batch, device, non_blocking);
  } else if constexpr (detail::passes_through<T>) {
    return batch;
  } else if constexpr (detail::tuple_like<T>) {
    return detail::tuple_to_device(batch, device, non_blocking, std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (detail::map_like<T>) {
    T moved;
    for (const auto& [key, value] : batch) moved.emplace(key, send_to_device(value, device, non_blocking));
    return moved;
  } else if constexpr (detail::sequence_like<T>) {
    T moved;
    if constexpr (requires { moved.reserve(batch.size()); }) moved.reserve(batch.size());
    for (const auto& element : batch) moved.push_back(send_to_device(element, device, non_blocking));
    return moved;
  } else {
    static_assert(detail::always_false<T>,
                  "accel cannot move this batch type to a device: specialise accel::batch_traits<T> with "
                  "`static T to_device(const T&, const torch::Device&, bool non_blocking)` (see accel/device.hpp)");
  }
}

}  // namespace accel
