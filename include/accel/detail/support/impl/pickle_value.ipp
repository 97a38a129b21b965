/// \file
/// What pickle_value.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../pickle_value.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>

// GCC 12 at -O3 takes a moved pickle_value's std::variant for a string that may be uninitialized (a false positive,
// as the tests' -O1 note in tests/CMakeLists.txt says), which -Werror would make an error in the accel tool's build.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace accel::detail {

namespace pickle_internals {

[[noreturn]] inline void wrong_type(std::string_view what, std::string_view expected) {
  throw std::invalid_argument("accel: " + std::string(what) + " is not " + std::string(expected));
}

template <class T>
void put_little(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  if constexpr (std::endian::native == std::endian::big) std::reverse(bytes, bytes + sizeof(T));
  out.append(bytes, sizeof(T));
}

inline void write_int(std::string& out, std::int64_t i) {
  if (i >= INT32_MIN && i <= INT32_MAX) {
    out += 'J';  // BININT
    put_little(out, static_cast<std::int32_t>(i));
    return;
  }
  out += '\x8a';  // LONG1: eight bytes of two's complement always hold an int64
  out += '\x08';
  put_little(out, i);
}

inline void write_value(std::string& out, const pickle_value& v);

inline void write_items(std::string& out, const pickle_value::sequence& s) {
  if (s.tuple && s.values.empty()) {
    out += ')';  // EMPTY_TUPLE
    return;
  }
  out += s.tuple ? "(" : "](";  // MARK, or EMPTY_LIST then MARK
  for (const auto& item : s.values) write_value(out, item);
  out += s.tuple ? 't' : 'e';  // TUPLE or APPENDS
}

inline void write_value(std::string& out, const pickle_value& v) {
  if (v.is_none()) {
    out += 'N';
  } else if (const auto* b = std::get_if<bool>(&v.value)) {
    out += *b ? '\x88' : '\x89';
  } else if (const auto* i = std::get_if<std::int64_t>(&v.value)) {
    write_int(out, *i);
  } else if (const auto* d = std::get_if<double>(&v.value)) {
    out += 'G';  // BINFLOAT: big-endian
    auto bits = std::bit_cast<std::uint64_t>(*d);
    for (int shift = 56; shift >= 0; shift -= 8) out += static_cast<char>((bits >> shift) & 0xff);
  } else if (const auto* s = std::get_if<std::string>(&v.value)) {
    out += 'X';  // BINUNICODE
    put_little(out, static_cast<std::uint32_t>(s->size()));
    out += *s;
  } else if (const auto* seq = std::get_if<std::shared_ptr<pickle_value::sequence>>(&v.value)) {
    write_items(out, **seq);
  } else {
    out += "}(";  // EMPTY_DICT, MARK
    for (const auto& [key, item] : *std::get<std::shared_ptr<pickle_value::pairs>>(v.value)) {
      write_value(out, key);
      write_value(out, item);
    }
    out += 'u';  // SETITEMS
  }
}

/// One run of the machine over a pickle of the subset.
class reader {
 public:
  reader(std::string_view bytes, const std::string& source) : bytes_(bytes), source_(source) {}

  pickle_value run() {
    while (true) {
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') break;  // STOP
      if (!constant_step(op) && !container_step(op) && !memo_step(op)) fail("opcode " + std::to_string(op));
    }
    if (stack_.size() != 1) fail("a stack of " + std::to_string(stack_.size()) + " values at STOP");
    return stack_.back();
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::invalid_argument("accel: " + source_ + " is not a pickle accel reads (" + why + ")");
  }
  std::string_view take(std::size_t n) {
    if (bytes_.size() - at_ < n) fail("truncated");
    auto part = bytes_.substr(at_, n);
    at_ += n;
    return part;
  }
  template <class T>
  T little() {
    T value{};
    auto part = take(sizeof(T));
    std::memcpy(&value, part.data(), sizeof(T));
    return value;
  }
  pickle_value pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) fail("an empty stack");
    auto v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  pickle_value::items pop_to_mark() {
    if (marks_.empty()) fail("no MARK");
    pickle_value::items items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back())),
                              std::make_move_iterator(stack_.end()));
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  pickle_value& top() {
    if (stack_.empty()) fail("an empty stack");
    return stack_.back();
  }
  std::int64_t long1(std::size_t n) {
    if (n > 8) fail("an integer of " + std::to_string(n) + " bytes");
    auto part = take(n);
    std::uint64_t bits = 0;
    for (std::size_t i = 0; i < n; ++i)
      bits |= static_cast<std::uint64_t>(static_cast<unsigned char>(part[i])) << (8 * i);
    if (n > 0 && n < 8 && (static_cast<unsigned char>(part[n - 1]) & 0x80)) bits |= ~std::uint64_t{0} << (8 * n);
    return static_cast<std::int64_t>(bits);
  }
  bool constant_step(unsigned char op);
  bool container_step(unsigned char op);
  bool memo_step(unsigned char op);
  void add_to(pickle_value& container, pickle_value::items items);

  std::string_view bytes_;
  const std::string& source_;
  std::size_t at_ = 0;
  std::vector<pickle_value> stack_;
  std::vector<std::size_t> marks_;
  std::map<std::int64_t, pickle_value> memo_;
};

inline bool reader::constant_step(unsigned char op) {
  switch (op) {
    case 0x80:
      take(1);
      return true;  // PROTO
    case 0x95:
      take(8);
      return true;  // FRAME
    case 'N':
      stack_.emplace_back();
      return true;  // NONE
    case 0x88:
      stack_.emplace_back(true);
      return true;
    case 0x89:
      stack_.emplace_back(false);
      return true;
    case 'J':
      stack_.emplace_back(static_cast<std::int64_t>(little<std::int32_t>()));
      return true;
    case 'K':
      stack_.emplace_back(static_cast<std::int64_t>(little<std::uint8_t>()));
      return true;
    case 'M':
      stack_.emplace_back(static_cast<std::int64_t>(little<std::uint16_t>()));
      return true;
    case 0x8a:
      stack_.emplace_back(long1(little<std::uint8_t>()));
      return true;
    case 'G': {
      auto part = take(8);
      std::uint64_t bits = 0;
      for (char c : part) bits = (bits << 8) | static_cast<unsigned char>(c);
      stack_.emplace_back(std::bit_cast<double>(bits));
      return true;
    }
    case 'X':
      stack_.emplace_back(std::string(take(little<std::uint32_t>())));
      return true;
    case 0x8c:
      stack_.emplace_back(std::string(take(little<std::uint8_t>())));
      return true;
    case 0x8d:
      stack_.emplace_back(std::string(take(little<std::uint64_t>())));
      return true;
    default:
      return false;
  }
}

inline void reader::add_to(pickle_value& container, pickle_value::items items) {
  if (container.is_dict()) {
    if (items.size() % 2 != 0) fail("a dict's keys without values");
    for (std::size_t i = 0; i < items.size(); i += 2) container.set(std::move(items[i]), std::move(items[i + 1]));
  } else if (container.is_sequence() && !std::get<std::shared_ptr<pickle_value::sequence>>(container.value)->tuple) {
    for (auto& item : items) container.push_back(std::move(item));
  } else {
    fail("items added to what is not a list or dict");
  }
}

inline bool reader::container_step(unsigned char op) {
  switch (op) {
    case ']':
      stack_.push_back(pickle_value::list());
      return true;
    case ')':
      stack_.push_back(pickle_value::tuple({}));
      return true;
    case '}':
      stack_.push_back(pickle_value::dict());
      return true;
    case '(':
      marks_.push_back(stack_.size());
      return true;
    case 'l':
      stack_.push_back(pickle_value::list(pop_to_mark()));
      return true;
    case 't':
      stack_.push_back(pickle_value::tuple(pop_to_mark()));
      return true;
    case 'd': {
      auto dict = pickle_value::dict();
      add_to(dict, pop_to_mark());
      stack_.push_back(std::move(dict));
      return true;
    }
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
      pickle_value::items items(op - 0x84);
      for (auto i = items.size(); i-- > 0;) items[i] = pop();
      stack_.push_back(pickle_value::tuple(std::move(items)));
      return true;
    }
    case 'e':
    case 'u': {  // APPENDS, SETITEMS
      auto items = pop_to_mark();
      add_to(top(), std::move(items));
      return true;
    }
    case 'a':
    case 's': {  // APPEND, SETITEM
      pickle_value::items items(op == 'a' ? 1 : 2);
      for (auto i = items.size(); i-- > 0;) items[i] = pop();
      add_to(top(), std::move(items));
      return true;
    }
    default:
      return false;
  }
}

inline bool reader::memo_step(unsigned char op) {
  switch (op) {
    case 'q':
      memo_[little<std::uint8_t>()] = top();
      return true;  // BINPUT
    case 'r':
      memo_[little<std::uint32_t>()] = top();
      return true;  // LONG_BINPUT
    case 0x94:
      memo_[static_cast<std::int64_t>(memo_.size())] = top();
      return true;  // MEMOIZE
    case 'h':
    case 'j': {  // BINGET, LONG_BINGET
      const std::int64_t key = op == 'h' ? little<std::uint8_t>() : little<std::uint32_t>();
      auto found = memo_.find(key);
      if (found == memo_.end()) fail("memo " + std::to_string(key) + " read before it was written");
      stack_.push_back(found->second);
      return true;
    }
    default:
      return false;
  }
}

}  // namespace pickle_internals

std::int64_t pickle_value::as_int(std::string_view what) const {
  if (!is_int()) pickle_internals::wrong_type(what, "an integer");
  return std::get<std::int64_t>(value);
}

const std::string& pickle_value::as_string(std::string_view what) const {
  if (!is_string()) pickle_internals::wrong_type(what, "a string");
  return std::get<std::string>(value);
}

const pickle_value::items& pickle_value::as_sequence(std::string_view what) const {
  if (!is_sequence()) pickle_internals::wrong_type(what, "a list or tuple");
  return std::get<std::shared_ptr<sequence>>(value)->values;
}

const pickle_value::pairs& pickle_value::as_dict(std::string_view what) const {
  if (!is_dict()) pickle_internals::wrong_type(what, "a dict");
  return *std::get<std::shared_ptr<pairs>>(value);
}

const pickle_value* pickle_value::find(std::string_view key) const {
  if (!is_dict()) return nullptr;
  for (const auto& [k, v] : *std::get<std::shared_ptr<pairs>>(value))
    if (k.is_string() && std::get<std::string>(k.value) == key) return &v;
  return nullptr;
}

const pickle_value& pickle_value::at(std::string_view key) const {
  if (const auto* found = find(key)) return *found;
  throw std::invalid_argument("accel: a dict without the key '" + std::string(key) + "'");
}

void pickle_value::set(pickle_value key, pickle_value item) {
  if (!is_dict()) pickle_internals::wrong_type("the value set into", "a dict");
  std::get<std::shared_ptr<pairs>>(value)->emplace_back(std::move(key), std::move(item));
}

void pickle_value::push_back(pickle_value item) {
  if (!is_sequence()) pickle_internals::wrong_type("the value appended to", "a list");
  std::get<std::shared_ptr<sequence>>(value)->values.push_back(std::move(item));
}

std::string write_pickle(const pickle_value& root) {
  std::string out = "\x80\x02";  // PROTO 2
  pickle_internals::write_value(out, root);
  out += '.';
  return out;
}

pickle_value read_pickle(std::string_view bytes, const std::string& source) {
  return pickle_internals::reader(bytes, source).run();
}

}  // namespace accel::detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
