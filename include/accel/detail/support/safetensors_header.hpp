/// \file
/// The JSON of a safetensors file's header and of Hugging Face's `model.safetensors.index.json`, read without
/// LibTorch: the `accel` command-line tool (`accel estimate-memory`) reads them as `accel::safetensors` does, and
/// `read_header` reads a file's header alone, never its data.
// IWYU pragma: private, include <accel/safetensors.hpp>
#pragma once

#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../checkpoint_error.hpp"
#include "json.hpp"

namespace accel::safetensors::detail {

/// The subset of JSON a safetensors header uses: objects, strings, arrays of non-negative integers.
class header_parser {
 public:
  struct entry {
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::vector<std::int64_t> offsets;
  };

  /// `file` and `kind` name what is read in errors.
  header_parser(std::string text, std::string file, std::string kind = "safetensors file")
      : text_(std::move(text)), file_(std::move(file)), kind_(std::move(kind)) {}

  /// A safetensors header: each tensor's entry in file order, and the `__metadata__` strings.
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

  /// Hugging Face's `model.safetensors.index.json`: its `weight_map` (tensor name -> file); other members skipped.
  std::map<std::string, std::string> index_weight_map() {
    std::map<std::string, std::string> weight_map;
    expect('{');
    if (peek() == '}') return ++pos_, weight_map;
    do {
      const auto name = string();
      expect(':');
      if (name == "weight_map")
        weight_map = string_map();
      else
        skip_value();
    } while (comma_or('}'));
    return weight_map;
  }

 private:
  /// Any JSON value (the index's `metadata`: numbers, strings, nested objects), read past.
  void skip_value() {
    const char c = peek();
    if (c == '"') return void(string());
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      if (peek() == close) return void(++pos_);
      do {
        if (close == '}') {
          string();
          expect(':');
        }
        skip_value();
      } while (comma_or(close));
      return;
    }
    const auto start = pos_;
    while (pos_ < text_.size() && std::string_view(",}] \t\r\n").find(text_[pos_]) == std::string_view::npos) ++pos_;
    if (start == pos_) fail("expected a value");
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw checkpoint_error("accel: " + file_ + " is not a valid " + kind_ + ": " + what + " at byte " +
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
  std::string kind_;
  std::size_t pos_ = 0;
};

/// A safetensors file's header: its tensors' entries in file order, the metadata, and where the data begins.
struct file_header {
  std::vector<std::pair<std::string, header_parser::entry>> entries;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_begin = 0;  ///< 8 + the header's length: the byte offsets are relative to it
};

/// Reads the header of the safetensors file at `path` (its first 8 + length bytes, nothing of its data).
inline file_header read_header(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw checkpoint_error("accel: cannot open " + path.string() + " for reading (missing file?)");
  std::uint64_t length = 0;
  if (!in.read(reinterpret_cast<char*>(&length), sizeof length))
    throw checkpoint_error("accel: " + path.string() + " is truncated: shorter than the 8-byte header length");
  const auto size = std::filesystem::file_size(path);
  if (length > size - 8)
    throw checkpoint_error("accel: " + path.string() + " is truncated or corrupt: its header claims " +
                           std::to_string(length) + " bytes, the file has " + std::to_string(size - 8) +
                           " after the length");
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  file_header header;
  header_parser(std::move(text), path.string()).parse(header.entries, header.metadata);
  header.data_begin = 8 + length;
  return header;
}

/// The files a `model.safetensors.index.json` names, each once, in the order of their names.
inline std::vector<std::filesystem::path> index_files(const std::filesystem::path& index) {
  std::ifstream in(index, std::ios::binary);
  if (!in) throw checkpoint_error("accel: cannot open " + index.string() + " for reading (missing file?)");
  std::string text(std::istreambuf_iterator<char>(in), {});
  std::map<std::string, bool> names;
  for (const auto& [tensor, file] :
       header_parser(std::move(text), index.string(), "safetensors index").index_weight_map())
    names[file];
  if (names.empty())
    throw checkpoint_error("accel: " + index.string() + " has no \"weight_map\" naming the files of the model");
  std::vector<std::filesystem::path> files;
  for (const auto& [name, unused] : names) files.push_back(index.parent_path() / name);
  return files;
}

}  // namespace accel::safetensors::detail
