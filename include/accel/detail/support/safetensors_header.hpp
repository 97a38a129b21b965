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

#include "../config.hpp"
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
  ACCEL_DECL void parse(std::vector<std::pair<std::string, entry>>& entries,
                        std::map<std::string, std::string>& metadata);

  /// Hugging Face's `model.safetensors.index.json`: its `weight_map` (tensor name -> file); other members skipped.
  ACCEL_DECL std::map<std::string, std::string> index_weight_map();

 private:
  /// Any JSON value (the index's `metadata`: numbers, strings, nested objects), read past.
  ACCEL_DECL void skip_value();
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

/// Reads the header of the safetensors file at `path` (its first 8 + length bytes, nothing of its data).
ACCEL_DECL file_header read_header(const std::filesystem::path& path);

/// The files a `model.safetensors.index.json` names, each once, in the order of their names.
ACCEL_DECL std::vector<std::filesystem::path> index_files(const std::filesystem::path& index);

}  // namespace accel::safetensors::detail

#if ACCEL_HEADER_ONLY
#include "impl/safetensors_header.ipp"
#endif
