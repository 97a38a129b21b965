/// \file
/// The JSON of a safetensors file's header and of Hugging Face's `model.safetensors.index.json`, read without
/// LibTorch: the `accel` command-line tool (`accel estimate-memory`) reads them as `accel::safetensors` does, and
/// `read_header` reads a file's header alone, never its data.
// IWYU pragma: private, include <accel/safetensors.hpp>
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "json.hpp"

namespace accel::safetensors::detail {

/// The longest header read (Python's safetensors refuses longer ones too, its MAX_HEADER_SIZE): a longer one is
/// refused before a byte of it is read.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

/// How deep the JSON read here may nest (an index's `metadata`): deeper is refused, not read by a recursion that a
/// hostile file could make overflow the stack.
inline constexpr std::size_t max_json_depth = 128;

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
  ACCEL_DECL void parse(std::vector<std::pair<std::string, entry>>& entries,
                        std::map<std::string, std::string>& metadata);

  /// Hugging Face's `model.safetensors.index.json`: its `weight_map` (tensor name -> file); other members skipped.
  ACCEL_DECL std::map<std::string, std::string> index_weight_map();

 private:
  /// Any JSON value (the index's `metadata`: numbers, strings, nested objects), read past; `depth`: how many
  /// arrays and objects hold it (at most `max_json_depth`).
  ACCEL_DECL void skip_value(std::size_t depth);
  [[noreturn]] ACCEL_DECL void fail(const std::string& what) const;
  ACCEL_DECL char peek();
  ACCEL_DECL void expect(char c);
  ACCEL_DECL bool comma_or(char close);
  ACCEL_DECL std::string string();
  ACCEL_DECL std::int64_t integer();
  ACCEL_DECL std::vector<std::int64_t> integers();
  ACCEL_DECL std::map<std::string, std::string> string_map();
  ACCEL_DECL entry tensor_entry();

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

/// The number of elements of a tensor of `shape` (`tensor` in `where` names it in the error): refused when it would
/// not fit in 64 bits, where a product that wraps would read as a small or negative count.
ACCEL_DECL std::int64_t element_count(const std::vector<std::int64_t>& shape, const std::string& tensor,
                                      const std::string& where);

/// Throws unless a header of `length` bytes (the file's first 8 bytes say it) is at most `max_header_bytes` and lies
/// within the `file_bytes` of the file (`where` names it).
ACCEL_DECL void check_header_length(std::uint64_t length, std::uint64_t file_bytes, const std::string& where);

/// Throws unless the tensors' byte ranges, in the order of their offsets, follow each other from 0 with neither a gap
/// nor an overlap, as the format requires (Python's safetensors: "invalid offset for tensor"), and, given
/// `data_bytes` (the bytes after the header), end exactly there ("file not fully covered"). A tensor that overlaps
/// another would read its bytes.
ACCEL_DECL void check_ranges(const std::vector<std::pair<std::string, header_parser::entry>>& entries,
                             std::optional<std::uint64_t> data_bytes, const std::string& where);

/// Reads the header of the safetensors file at `path` (its first 8 + length bytes, nothing of its data), its ranges
/// checked (`check_ranges`, without the data's length: the file's data need not be there).
ACCEL_DECL file_header read_header(const std::filesystem::path& path);

/// The `weight_map` of a Hugging Face `model.safetensors.index.json`: tensor name -> file, beside the index.
ACCEL_DECL std::map<std::string, std::string> read_weight_map(const std::filesystem::path& index);

/// The files a `model.safetensors.index.json` names, each once, in the order of their names.
ACCEL_DECL std::vector<std::filesystem::path> index_files(const std::filesystem::path& index);

}  // namespace accel::safetensors::detail

#if ACCEL_HEADER_ONLY
#include "impl/safetensors_header.ipp"
#endif
