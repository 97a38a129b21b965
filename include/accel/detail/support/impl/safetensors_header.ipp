/// \file
/// What safetensors_header.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../safetensors_header.hpp"

namespace accel::safetensors::detail {

void header_parser::parse(std::vector<std::pair<std::string, entry>>& entries,
                          std::map<std::string, std::string>& metadata) {
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

std::map<std::string, std::string> header_parser::index_weight_map() {
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

void header_parser::skip_value() {
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

void header_parser::fail(const std::string& what) const {
  throw checkpoint_error("accel: " + file_ + " is not a valid " + kind_ + ": " + what + " at byte " +
                         std::to_string(pos_) + " of its header");
}

char header_parser::peek() {
  while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  if (pos_ >= text_.size()) fail("the header ends early");
  return text_[pos_];
}

void header_parser::expect(char c) {
  if (peek() != c) fail(std::string("expected '") + c + "'");
  ++pos_;
}

bool header_parser::comma_or(char close) {
  const char c = peek();
  ++pos_;
  if (c == ',') return true;
  if (c != close) fail(std::string("expected ',' or '") + close + "'");
  return false;
}

std::string header_parser::string() {
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

std::int64_t header_parser::integer() {
  peek();
  const auto start = pos_;
  while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  if (start == pos_ || pos_ - start > 18) fail("expected a non-negative integer");
  return std::stoll(text_.substr(start, pos_ - start));
}

std::vector<std::int64_t> header_parser::integers() {
  std::vector<std::int64_t> out;
  expect('[');
  if (peek() == ']') return ++pos_, out;
  do out.push_back(integer());
  while (comma_or(']'));
  return out;
}

std::map<std::string, std::string> header_parser::string_map() {
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

header_parser::entry header_parser::tensor_entry() {
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

file_header read_header(const std::filesystem::path& path) {
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

std::vector<std::filesystem::path> index_files(const std::filesystem::path& index) {
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
