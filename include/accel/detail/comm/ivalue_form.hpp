/// \file
/// `ivalue_form<T>`: how a value of type `T` travels between processes, as a `c10::IValue` that is pickled
/// (gather_object, broadcast_object_list, dispatch_batches' channel), and back, unchanged. Bools, 64-bit integers,
/// doubles, strings and tensors are what an IValue holds as they are; other numbers travel converted (an `int` as a
/// 64-bit integer, a `float` as a double: both exact); a type with `save(torch::serialize::OutputArchive&) const`,
/// `load(torch::serialize::InputArchive&)` and a default constructor (what `register_for_checkpointing` takes)
/// travels as its archive's bytes; `std::vector`, `std::pair`, `std::tuple`, `std::map<std::string, ...>` and
/// `torch::data::Example` of those, to any depth, as lists, tuples and dicts of their elements' forms.
/// `ivalue_holds<T>` says whether `T` has a form; a type without one is refused at compile time.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/data/example.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../support/archive.hpp"

namespace accel::detail {

/// No form: `ivalue_holds<T>` is false.
template <class T>
struct ivalue_form {};

/// Whether values of `T` can travel between processes (`ivalue_form<T>` converts both ways).
template <class T>
concept ivalue_holds = requires(const T& value, const c10::IValue& ivalue) {
  { ivalue_form<T>::to(value) } -> std::same_as<c10::IValue>;
  { ivalue_form<T>::from(ivalue) } -> std::same_as<T>;
};

/// What a `c10::IValue` holds as it is.
template <class T>
concept ivalue_exact = std::same_as<T, bool> || std::same_as<T, std::int64_t> || std::same_as<T, double> ||
                       std::same_as<T, std::string> || std::same_as<T, at::Tensor>;

template <class T>
  requires ivalue_exact<T>
struct ivalue_form<T> {
  static c10::IValue to(const T& value) { return c10::IValue(value); }
  static T from(const c10::IValue& value) { return value.to<T>(); }
};

/// Other integers travel as 64-bit integers and other floating-point numbers (float) as doubles: both exact (an
/// unsigned 64-bit value above the signed range wraps there and back). An IValue cannot hold them as they are: a
/// `std::vector<int>` pickled as one fails to load ("Type int could not be converted").
template <class T>
  requires(std::is_arithmetic_v<T> && !ivalue_exact<T> && (std::integral<T> || sizeof(T) <= sizeof(double)))
struct ivalue_form<T> {
  using carrier = std::conditional_t<std::integral<T>, std::int64_t, double>;
  static c10::IValue to(const T& value) { return c10::IValue(static_cast<carrier>(value)); }
  static T from(const c10::IValue& value) { return static_cast<T>(value.to<carrier>()); }
};

/// A type serialised by its own members (the customisation point of `register_for_checkpointing`), which can be
/// built empty to load into.
template <class T>
concept archive_object = archive_serialisable<T> && std::default_initializable<T> && !ivalue_exact<T>;

/// An archive object travels as the bytes of its LibTorch archive, in a string.
template <archive_object T>
struct ivalue_form<T> {
  static c10::IValue to(const T& value) {
    torch::serialize::OutputArchive archive;
    value.save(archive);
    return c10::IValue(serialised(archive));
  }
  static T from(const c10::IValue& value) {
    const auto& bytes = value.toStringRef();
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size());
    T object;
    object.load(archive);
    return object;
  }
};

template <ivalue_holds T>
struct ivalue_form<std::vector<T>> {
  static c10::IValue to(const std::vector<T>& values) {
    c10::impl::GenericList list(c10::AnyType::get());
    list.reserve(values.size());
    for (const auto& value : values) list.push_back(ivalue_form<T>::to(value));
    return list;
  }
  static std::vector<T> from(const c10::IValue& value) {
    std::vector<T> values;
    const auto items = value.toListRef();
    values.reserve(items.size());
    for (const auto& item : items) values.push_back(ivalue_form<T>::from(item));
    return values;
  }
};

template <ivalue_holds... Ts>
struct ivalue_form<std::tuple<Ts...>> {
  static c10::IValue to(const std::tuple<Ts...>& value) {
    return std::apply(
        [](const auto&... item) {
          return c10::ivalue::Tuple::create(std::vector<c10::IValue>{ivalue_form<Ts>::to(item)...});
        },
        value);
  }
  static std::tuple<Ts...> from(const c10::IValue& value) {
    const auto& elements = value.toTupleRef().elements();
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<Ts...>{ivalue_form<Ts>::from(elements[I])...};
    }(std::index_sequence_for<Ts...>{});
  }
};

template <ivalue_holds A, ivalue_holds B>
struct ivalue_form<std::pair<A, B>> {
  static c10::IValue to(const std::pair<A, B>& value) {
    return ivalue_form<std::tuple<A, B>>::to(std::tuple<A, B>(value.first, value.second));
  }
  static std::pair<A, B> from(const c10::IValue& value) {
    auto [first, second] = ivalue_form<std::tuple<A, B>>::from(value);
    return {std::move(first), std::move(second)};
  }
};

template <ivalue_holds Data, ivalue_holds Target>
struct ivalue_form<torch::data::Example<Data, Target>> {
  static c10::IValue to(const torch::data::Example<Data, Target>& value) {
    return ivalue_form<std::pair<Data, Target>>::to({value.data, value.target});
  }
  static torch::data::Example<Data, Target> from(const c10::IValue& value) {
    auto [data, target] = ivalue_form<std::pair<Data, Target>>::from(value);
    return {std::move(data), std::move(target)};
  }
};

template <ivalue_holds T>
struct ivalue_form<std::map<std::string, T>> {
  static c10::IValue to(const std::map<std::string, T>& values) {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [key, value] : values) dict.insert(key, ivalue_form<T>::to(value));
    return dict;
  }
  static std::map<std::string, T> from(const c10::IValue& value) {
    std::map<std::string, T> values;
    for (const auto& entry : value.toGenericDict())
      values.emplace(entry.key().toStringRef(), ivalue_form<T>::from(entry.value()));
    return values;
  }
};

}  // namespace accel::detail
