/// \file
/// The safetensors format, written and read here without any other library: an 8-byte little-endian header
/// length, a JSON header (`{"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...,
/// "__metadata__": {...}}`), then the tensors' raw little-endian bytes in C order. Files written here load in
/// Python with `safetensors` (or a few lines of numpy), and Python's files load here.
///
/// `accel::safetensors::save` writes atomically (a temporary file renamed into place); `load` validates
/// everything it reads (header length, JSON, dtypes, shapes against byte ranges, ranges against the file) and
/// throws `accel::checkpoint_error` naming the file and the problem.
#pragma once

#include <ATen/ATen.h>

#include <bit>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint_error.hpp"
#include "detail/support/atomic_file.hpp"
#include "detail/support/json.hpp"
#include "detail/support/text.hpp"

namespace accel {

namespace safetensors {

/// Named tensors in file order.
using tensor_list = std::vector<std::pair<std::string, at::Tensor>>;

namespace detail {

static_assert(std::endian::native == std::endian::little, "accel::safetensors writes little-endian data");

inline const std::map<c10::ScalarType, std::string>& dtype_names() {
  static const std::map<c10::ScalarType, std::string> names = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"}, {at::kLong, "I64"},
      {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},  {at::kByte, "U8"},       {at::kBool, "BOOL"}};
  return names;
}

/// The subset of JSON a safetensors header uses: objects, strings, arrays of non-negative integers.
class header_parser {
 public:
  struct entry {
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::vector<std::int64_t> offsets;
  };

  header_parser(std::string text, std::string file) : text_(std::move(text)), file_(std::move(file)) {}

  void parse(std::vector<std::pair<std::string, entry>>& entries, std::map<std::string, std::string>& metadata) {
    expect('{');
    if (peek() == '}') return void(++pos_);
    do {
      auto name = string();
      expect(':');
      if (name == "__metadata__")
        metadata = string_map();
      else
        entries.emplace_back(std::move(name), tensor_entry());
    } while (comma_or('}'));
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw checkpoint_error("accel: " + file_ + " is not a valid safetensors file: " + what + " at byte " +
                           std::to_string(pos_) + " of its header");
  }
  char peek() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    if (pos_ >= text_.size()) fail("the header ends early");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool comma_or(char close) {
    const char c = peek();
    ++pos_;
    if (c == ',') return true;
    if (c != close) fail(std::string("expected ',' or '") + close + "'");
    return false;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("a string is not closed");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (c == '\\') {
        if (pos_ >= text_.size()) fail("a string is not closed");
        c = text_[pos_++];
        if (c == 'u') {
          if (pos_ + 4 > text_.size()) fail("a \\u escape is cut short");
          const auto code = std::stoul(text_.substr(pos_, 4), nullptr, 16);
          pos_ += 4;
          accel::detail::append_utf8(out, code);
          continue;
        }
        const std::map<char, char> escapes = {{'"', '"'},  {'\\', '\\'}, {'/', '/'},  {'b', '\b'},
                                              {'f', '\f'}, {'n', '\n'},  {'r', '\r'}, {'t', '\t'}};
        auto found = escapes.find(c);
        if (found == escapes.end()) fail("an unknown escape in a string");
        out += found->second;
      } else {
        out += c;
      }
    }
  }
  std::int64_t integer() {
    peek();
    const auto start = pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    if (start == pos_ || pos_ - start > 18) fail("expected a non-negative integer");
    return std::stoll(text_.substr(start, pos_ - start));
  }
  std::vector<std::int64_t> integers() {
    std::vector<std::int64_t> out;
    expect('[');
    if (peek() == ']') return ++pos_, out;
    do out.push_back(integer());
    while (comma_or(']'));
    return out;
  }
  std::map<std::string, std::string> string_map() {
    std::map<std::string, std::string> out;
    expect('{');
    if (peek() == '}') return ++pos_, out;
    do {
      auto key = string();
      expect(':');
      out[key] = string();
    } while (comma_or('}'));
    return out;
  }
  entry tensor_entry() {
    entry e;
    expect('{');
    do {
      const auto key = string();
      expect(':');
      if (key == "dtype")
        e.dtype = string();
      else if (key == "shape")
        e.shape = integers();
      else if (key == "data_offsets")
        e.offsets = integers();
      else
        fail("an unknown field \"" + key + "\" in a tensor entry");
    } while (comma_or('}'));
    return e;
  }

  std::string text_;
  std::string file_;
  std::size_t pos_ = 0;
};

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw checkpoint_error("accel: cannot open " + path.string() + " for reading (missing file?)");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace detail

/// Writes `tensors` (any device, dtype among F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL) to `path`, atomically.
inline ::accel::detail::written_file save(const std::filesystem::path& path, const tensor_list& tensors,
                                          const std::map<std::string, std::string>& metadata = {{"format", "pt"}}) {
  std::vector<at::Tensor> contiguous;
  std::string header = "{";
  std::int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    auto dtype = detail::dtype_names().find(tensor.scalar_type());
    if (dtype == detail::dtype_names().end())
      throw checkpoint_error("accel: cannot write tensor " + name + " to " + path.string() + ": safetensors has no " +
                             std::string(c10::toString(tensor.scalar_type())) + " type");
    contiguous.push_back(tensor.detach().to(at::kCPU).contiguous());
    const auto bytes = static_cast<std::int64_t>(contiguous.back().nbytes());
    std::string shape;
    for (auto d : tensor.sizes()) ::accel::detail::append_item(shape, std::to_string(d), ",");
    header += ::accel::detail::json_string(name) + ":{\"dtype\":\"" + dtype->second + "\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]},";
    offset += bytes;
  }
  header += "\"__metadata__\":{";
  for (const auto& [key, value] : metadata)
    header += ::accel::detail::json_string(key) + ":" + ::accel::detail::json_string(value) + ",";
  if (header.back() == ',') header.pop_back();
  header += "}}";
  while (header.size() % 8 != 0) header += ' ';  // the data starts 8-byte aligned, as the reference writer does
  return ::accel::detail::write_atomically<checkpoint_error>(path, [&](auto& out) {
    const std::uint64_t length = header.size();
    out.write(&length, sizeof length);
    out.write(header);
    for (const auto& t : contiguous) out.write(t.data_ptr(), t.nbytes());
  });
}

/// Reads every tensor of a safetensors file's bytes, `file` (on the CPU), validating it first; `where` names the
/// file in errors.
inline tensor_list parse(std::string_view file, const std::string& where,
                         std::map<std::string, std::string>* metadata = nullptr) {
  if (file.size() < 8)
    throw checkpoint_error("accel: " + where + " is truncated: shorter than the 8-byte header length");
  std::uint64_t length = 0;
  std::memcpy(&length, file.data(), sizeof length);
  if (length > file.size() - 8)
    throw checkpoint_error("accel: " + where + " is truncated or corrupt: its header claims " + std::to_string(length) +
                           " bytes, the file has " + std::to_string(file.size() - 8) + " after the length");
  std::vector<std::pair<std::string, detail::header_parser::entry>> entries;
  std::map<std::string, std::string> meta;
  detail::header_parser(std::string(file.data() + 8, length), where).parse(entries, meta);
  const auto data_begin = 8 + length;
  const auto data_size = static_cast<std::int64_t>(file.size() - data_begin);
  tensor_list out;
  for (const auto& [name, e] : entries) {
    const at::ScalarType* type = nullptr;
    for (const auto& [t, n] : detail::dtype_names())
      if (n == e.dtype) type = &t;
    if (type == nullptr)
      throw checkpoint_error("accel: " + where + ": tensor " + name + " has the unknown dtype " + e.dtype);
    if (e.offsets.size() != 2 || e.offsets[0] > e.offsets[1] || e.offsets[1] > data_size)
      throw checkpoint_error("accel: " + where + " is truncated or corrupt: tensor " + name +
                             "'s bytes lie outside the file's data");
    std::int64_t numel = 1;
    for (auto d : e.shape) numel *= d;
    if (numel * static_cast<std::int64_t>(c10::elementSize(*type)) != e.offsets[1] - e.offsets[0])
      throw checkpoint_error("accel: " + where + " is corrupt: tensor " + name + "'s shape does not match its " +
                             std::to_string(e.offsets[1] - e.offsets[0]) + " bytes");
    auto tensor = at::empty(e.shape, at::TensorOptions().dtype(*type));
    std::memcpy(tensor.data_ptr(), file.data() + data_begin + e.offsets[0],
                static_cast<std::size_t>(e.offsets[1] - e.offsets[0]));
    out.emplace_back(name, std::move(tensor));
  }
  if (metadata != nullptr) *metadata = std::move(meta);
  return out;
}

/// Reads every tensor of the file at `path` (on the CPU), validating it first.
inline tensor_list load(const std::filesystem::path& path, std::map<std::string, std::string>* metadata = nullptr) {
  return parse(detail::read_file(path), path.string(), metadata);
}

}  // namespace safetensors
}  // namespace accel
