/// \file
/// Python pickles of plain values without Python or LibTorch: what the flight recorder's dumps are (PyTorch's
/// analyser reads them with `pickle.load`), written and read back by `accel fr-trace`. The subset: None, bools,
/// integers, floats, strings, lists, tuples and dicts, written with protocol 2's opcodes; the reader also takes the
/// memo and framing opcodes that Python's and LibTorch's picklers add, so that it reads PyTorch's own dumps.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "../config.hpp"

namespace accel::detail {

/// One value of the subset. Lists, tuples and dicts are shared (a pickle's memo may refer to one twice).
struct pickle_value {
  struct list_tag {};
  struct tuple_tag {};
  using items = std::vector<pickle_value>;
  using pairs = std::vector<std::pair<pickle_value, pickle_value>>;
  struct sequence {
    bool tuple = false;
    items values;
  };
  std::variant<std::monostate, bool, std::int64_t, double, std::string, std::shared_ptr<sequence>,
               std::shared_ptr<pairs>>
      value;

  pickle_value() = default;
  pickle_value(bool b) : value(b) {}                            // NOLINT: values read as Python's literals
  pickle_value(std::int64_t i) : value(i) {}                    // NOLINT
  pickle_value(int i) : value(static_cast<std::int64_t>(i)) {}  // NOLINT
  pickle_value(double d) : value(d) {}                          // NOLINT
  pickle_value(std::string s) : value(std::move(s)) {}          // NOLINT
  pickle_value(const char* s) : value(std::string(s)) {}        // NOLINT

  [[nodiscard]] static pickle_value list(items values = {}) {
    pickle_value v;
    v.value = std::make_shared<sequence>(sequence{false, std::move(values)});
    return v;
  }
  [[nodiscard]] static pickle_value tuple(items values) {
    pickle_value v;
    v.value = std::make_shared<sequence>(sequence{true, std::move(values)});
    return v;
  }
  [[nodiscard]] static pickle_value dict(pairs values = {}) {
    pickle_value v;
    v.value = std::make_shared<pairs>(std::move(values));
    return v;
  }

  [[nodiscard]] bool is_none() const noexcept { return std::holds_alternative<std::monostate>(value); }
  [[nodiscard]] bool is_int() const noexcept { return std::holds_alternative<std::int64_t>(value); }
  [[nodiscard]] bool is_string() const noexcept { return std::holds_alternative<std::string>(value); }
  [[nodiscard]] bool is_sequence() const noexcept { return std::holds_alternative<std::shared_ptr<sequence>>(value); }
  [[nodiscard]] bool is_dict() const noexcept { return std::holds_alternative<std::shared_ptr<pairs>>(value); }

  /// The value as that type; a `std::invalid_argument` naming `what` when it is another.
  [[nodiscard]] ACCEL_DECL std::int64_t as_int(std::string_view what) const;
  [[nodiscard]] ACCEL_DECL const std::string& as_string(std::string_view what) const;
  [[nodiscard]] ACCEL_DECL const items& as_sequence(std::string_view what) const;
  [[nodiscard]] ACCEL_DECL const pairs& as_dict(std::string_view what) const;
  /// The value of a dict's string key `key`, or nullptr.
  [[nodiscard]] ACCEL_DECL const pickle_value* find(std::string_view key) const;
  /// The value of `key`; a `std::invalid_argument` when the dict lacks it.
  [[nodiscard]] ACCEL_DECL const pickle_value& at(std::string_view key) const;
  /// Appends a key and value to a dict (keys are not checked for repeats: the writer's dicts are built once).
  ACCEL_DECL void set(pickle_value key, pickle_value item);
  /// Appends to a list.
  ACCEL_DECL void push_back(pickle_value item);
};

/// `root` as a pickle (protocol 2).
[[nodiscard]] ACCEL_DECL std::string write_pickle(const pickle_value& root);

/// The value a pickle holds; a `std::invalid_argument` naming `source` for an opcode outside the subset or a
/// truncated or malformed pickle.
[[nodiscard]] ACCEL_DECL pickle_value read_pickle(std::string_view bytes, const std::string& source);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/pickle_value.ipp"
#endif
