/// \file
/// Nested structures of tensors (`std::vector`, `std::tuple`, `std::pair`, `std::map<std::string, ...>` of
/// tensors, to any depth), as the collectives accept them and as model outputs come, and `map_tensors` to rebuild
/// one with every tensor transformed.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace accel::detail {

// Nested structures of tensors: what gather, reduce, pad and broadcast accept.
template <class T>
inline constexpr bool is_tensor_structure = std::is_same_v<T, at::Tensor>;
template <class T>
inline constexpr bool is_tensor_structure<std::vector<T>> = is_tensor_structure<T>;
template <class... Ts>
inline constexpr bool is_tensor_structure<std::tuple<Ts...>> = (is_tensor_structure<Ts> && ...);
template <class A, class B>
inline constexpr bool is_tensor_structure<std::pair<A, B>> = is_tensor_structure<A> && is_tensor_structure<B>;
template <class T>
inline constexpr bool is_tensor_structure<std::map<std::string, T>> = is_tensor_structure<T>;

/// Applies `f` to every tensor of a structure, in a fixed order, and rebuilds the structure from the results.
/// All overloads are declared first: each recursive call must see the others whatever the nesting order (argument-
/// dependent lookup would not find them from std::pair or a lambda's namespace).
template <class F>
at::Tensor map_tensors(const at::Tensor& tensor, F& f);
template <class T, class F>
std::vector<T> map_tensors(const std::vector<T>& items, F& f);
template <class... Ts, class F>
std::tuple<Ts...> map_tensors(const std::tuple<Ts...>& items, F& f);
template <class A, class B, class F>
std::pair<A, B> map_tensors(const std::pair<A, B>& items, F& f);
template <class T, class F>
std::map<std::string, T> map_tensors(const std::map<std::string, T>& items, F& f);

template <class F>
at::Tensor map_tensors(const at::Tensor& tensor, F& f) {
  return f(tensor);
}
template <class T, class F>
std::vector<T> map_tensors(const std::vector<T>& items, F& f) {
  std::vector<T> out;
  out.reserve(items.size());
  for (const auto& item : items) out.push_back(map_tensors(item, f));
  return out;
}
template <class... Ts, class F>
std::tuple<Ts...> map_tensors(const std::tuple<Ts...>& items, F& f) {
  return std::apply([&](const auto&... item) { return std::tuple<Ts...>{map_tensors(item, f)...}; }, items);
}
template <class A, class B, class F>
std::pair<A, B> map_tensors(const std::pair<A, B>& items, F& f) {
  return {map_tensors(items.first, f), map_tensors(items.second, f)};
}
template <class T, class F>
std::map<std::string, T> map_tensors(const std::map<std::string, T>& items, F& f) {
  std::map<std::string, T> out;
  for (const auto& [key, item] : items) out.emplace(key, map_tensors(item, f));
  return out;
}

}  // namespace accel::detail
