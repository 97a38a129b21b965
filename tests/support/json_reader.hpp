// A strict JSON reader (RFC 8259) for the tests that read what accel or LibTorch wrote: anything that is not JSON
// (a trailing comma, NaN, a control character in a string, text after the value) is an error naming the offset.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace accel_test::json {

/// A JSON value. Objects keep their members in order (`keys[i]` names `items[i]`); arrays use `items` alone.
struct value {
  enum class kind { null, boolean, number, string, array, object };
  kind type = kind::null;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<std::string> keys;
  std::vector<value> items;

  [[nodiscard]] bool is_array() const { return type == kind::array; }
  [[nodiscard]] bool is_number() const { return type == kind::number; }
  /// The member named `key` of an object; nullptr when there is none (or this is not an object).
  [[nodiscard]] const value* find(std::string_view key) const {
    if (type != kind::object) return nullptr;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return &items[i];
    return nullptr;
  }
  /// The member named `key`; throws when there is none.
  [[nodiscard]] const value& at(std::string_view key) const {
    if (const auto* member = find(key)) return *member;
    throw std::out_of_range("JSON object has no member \"" + std::string(key) + "\"");
  }
};

namespace detail {

class parser {
 public:
  explicit parser(std::string_view text) : text_(text) {}

  value document() {
    auto result = parse_value();
    skip_space();
    if (pos_ != text_.size()) fail("text after the value");
    return result;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("invalid JSON at offset " + std::to_string(pos_) + ": " + what);
  }
  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  char peek() {
    skip_space();
    if (pos_ == text_.size()) fail("unexpected end");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  void literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) fail("unknown literal");
    pos_ += word.size();
  }

  value parse_value() {
    value v;
    switch (peek()) {
      case '{':
        v.type = value::kind::object;
        ++pos_;
        if (peek() == '}') return ++pos_, v;
        do {
          if (peek() != '"') fail("expected a member name");
          v.keys.push_back(parse_string());
          expect(':');
          v.items.push_back(parse_value());
        } while (peek() == ',' && ++pos_);
        expect('}');
        return v;
      case '[':
        v.type = value::kind::array;
        ++pos_;
        if (peek() == ']') return ++pos_, v;
        do v.items.push_back(parse_value());
        while (peek() == ',' && ++pos_);
        expect(']');
        return v;
      case '"':
        v.type = value::kind::string;
        v.text = parse_string();
        return v;
      case 't':
        literal("true");
        v.type = value::kind::boolean;
        v.boolean = true;
        return v;
      case 'f':
        literal("false");
        v.type = value::kind::boolean;
        return v;
      case 'n':
        literal("null");
        return v;
      default:
        v.type = value::kind::number;
        v.number = parse_number();
        return v;
    }
  }

  bool digits() {
    const auto start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    return pos_ > start;
  }
  double parse_number() {
    const auto start = pos_;
    if (text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0')
      ++pos_;
    else if (!digits())
      fail("expected a value");
    if (pos_ < text_.size() && text_[pos_] == '.' && (++pos_, !digits())) fail("expected digits after '.'");
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digits()) fail("expected exponent digits");
    }
    return std::strtod(std::string(text_.substr(start, pos_ - start)).c_str(), nullptr);
  }

  unsigned hex4() {
    if (pos_ + 4 > text_.size()) fail("short \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      code <<= 4;
      if (c >= '0' && c <= '9')
        code |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        code |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        code |= static_cast<unsigned>(c - 'A' + 10);
      else
        fail("bad \\u escape");
    }
    return code;
  }
  static void append_utf8(std::string& out, std::uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }
  std::string parse_string() {
    ++pos_;  // the opening quote
    std::string out;
    while (true) {
      if (pos_ == text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ == text_.size()) fail("unterminated escape");
      switch (const char e = text_[pos_++]) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::uint32_t code = hex4();
          if (code >= 0xD800 && code < 0xDC00) {  // a surrogate pair
            if (text_.substr(pos_, 2) != "\\u") fail("lone high surrogate");
            pos_ += 2;
            const auto low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("bad low surrogate");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, code);
          break;
        }
        default:
          fail("unknown escape");
      }
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace detail

/// `text` parsed; throws std::runtime_error at the first thing that is not JSON.
inline value parse(std::string_view text) { return detail::parser(text).document(); }

/// The file at `path` parsed.
inline value parse_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return parse(std::string(std::istreambuf_iterator<char>(in), {}));
}

}  // namespace accel_test::json
