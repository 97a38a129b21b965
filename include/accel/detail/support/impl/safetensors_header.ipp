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
      skip_value(0);
  } while (comma_or('}'));
  return weight_map;
}

void header_parser::skip_value(std::size_t depth) {
  const char c = peek();
  if (c == '"') return void(string());
  if (c == '{' || c == '[') {
    if (depth == max_json_depth)
      fail("values nest more than " + std::to_string(max_json_depth) + " levels deep (the limit of what is read)");
    const char close = c == '{' ? '}' : ']';
    ++pos_;
    if (peek() == close) return void(++pos_);
    do {
      if (close == '}') {
        string();
        expect(':');
      }
      skip_value(depth + 1);
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
        unsigned code = 0;
        const auto digits = std::string_view(text_).substr(pos_, 4);
        if (std::from_chars(digits.data(), digits.data() + 4, code, 16).ptr != digits.data() + 4)
          fail("a \\u escape is not followed by 4 hexadecimal digits");
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

std::int64_t element_count(const std::vector<std::int64_t>& shape, const std::string& tensor,
                           const std::string& where) {
  std::int64_t count = 1;
  for (const auto d : shape)
    if (d < 0 || __builtin_mul_overflow(count, d, &count))
      throw checkpoint_error("accel: " + where + ": tensor " + tensor +
                             " has a shape of more elements than 64 bits count " +
                             "(or a negative size); the header is corrupt or hostile");
  return count;
}

void check_header_length(std::uint64_t length, std::uint64_t file_bytes, const std::string& where) {
  if (length > max_header_bytes)
    throw checkpoint_error("accel: " + where + " is not a safetensors file accel reads: its header claims " +
                           std::to_string(length) + " bytes, more than the " + std::to_string(max_header_bytes) +
                           " a header may have (Python's safetensors refuses it too)");
  if (length > file_bytes - 8)
    throw checkpoint_error("accel: " + where + " is truncated or corrupt: its header claims " + std::to_string(length) +
                           " bytes, the file has " + std::to_string(file_bytes - 8) + " after the length");
}

void check_ranges(const std::vector<std::pair<std::string, header_parser::entry>>& entries,
                  std::optional<std::uint64_t> data_bytes, const std::string& where) {
  std::vector<const std::pair<std::string, header_parser::entry>*> by_offset;
  for (const auto& entry : entries) {
    const auto& offsets = entry.second.offsets;
    if (offsets.size() != 2 || offsets[0] > offsets[1])
      throw checkpoint_error("accel: " + where + " is corrupt: tensor " + entry.first +
                             "'s data_offsets are not [begin, end] with begin <= end");
    by_offset.push_back(&entry);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->second.offsets < b->second.offsets; });
  std::int64_t end = 0;
  for (const auto* entry : by_offset) {
    if (entry->second.offsets[0] != end)
      throw checkpoint_error("accel: " + where + " is corrupt: invalid offset for tensor " + entry->first +
                             ": its bytes begin at " + std::to_string(entry->second.offsets[0]) +
                             " of the data, where the tensor before it ends at " + std::to_string(end) +
                             " (the tensors' byte ranges must follow each other without a gap or an overlap)");
    end = entry->second.offsets[1];
  }
  if (data_bytes && static_cast<std::uint64_t>(end) > *data_bytes)
    throw checkpoint_error("accel: " + where + " is truncated or corrupt: its tensors' bytes end at " +
                           std::to_string(end) + " of the data, which has " + std::to_string(*data_bytes) +
                           " (their bytes lie outside the file)");
  if (data_bytes && static_cast<std::uint64_t>(end) != *data_bytes)
    throw checkpoint_error("accel: " + where + " is corrupt: its tensors' bytes end at " + std::to_string(end) +
                           " of the data, which has " + std::to_string(*data_bytes) +
                           " (the tensors must cover the data exactly)");
}

file_header read_header(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw checkpoint_error("accel: cannot open " + path.string() + " for reading (missing file?)");
  std::uint64_t length = 0;
  if (!in.read(reinterpret_cast<char*>(&length), sizeof length))
    throw checkpoint_error("accel: " + path.string() + " is truncated: shorter than the 8-byte header length");
  check_header_length(length, std::filesystem::file_size(path), path.string());
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  file_header header;
  header_parser(std::move(text), path.string()).parse(header.entries, header.metadata);
  check_ranges(header.entries, std::nullopt, path.string());
  header.data_begin = 8 + length;
  return header;
}

std::map<std::string, std::string> read_weight_map(const std::filesystem::path& index) {
  std::ifstream in(index, std::ios::binary);
  if (!in) throw checkpoint_error("accel: cannot open " + index.string() + " for reading (missing file?)");
  std::string text(std::istreambuf_iterator<char>(in), {});
  auto weight_map = header_parser(std::move(text), index.string(), "safetensors index").index_weight_map();
  if (weight_map.empty())
    throw checkpoint_error("accel: " + index.string() + " has no \"weight_map\" naming the files of the model");
  return weight_map;
}

std::vector<std::filesystem::path> index_files(const std::filesystem::path& index) {
  std::map<std::string, bool> names;
  for (const auto& [tensor, file] : read_weight_map(index)) names[file];
  std::vector<std::filesystem::path> files;
  for (const auto& [name, unused] : names) files.push_back(index.parent_path() / name);
  return files;
}

}  // namespace accel::safetensors::detail
