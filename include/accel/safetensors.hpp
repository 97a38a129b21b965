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
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "detail/config.hpp"
#include "checkpoint_error.hpp"
#include "detail/support/atomic_file.hpp"
#include "detail/support/json.hpp"
#include "detail/support/safetensors_header.hpp"
#include "detail/support/text.hpp"

namespace accel {

namespace safetensors {

/// Named tensors in file order.
using tensor_list = std::vector<std::pair<std::string, at::Tensor>>;

namespace detail {

static_assert(std::endian::native == std::endian::little, "accel::safetensors writes little-endian data");

ACCEL_DECL const std::map<c10::ScalarType, std::string>& dtype_names();

ACCEL_DECL std::string read_file(const std::filesystem::path& path);

}  // namespace detail

namespace detail {

/// One tensor as a header describes it: its dtype's name (`F32`), shape and bytes.
struct stored_tensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::int64_t bytes = 0;
};

/// The header `save` writes for `tensors` stored in this order, padded so that the data starts 8-byte aligned.
ACCEL_DECL std::string header_text(const std::vector<stored_tensor>& tensors,
                                   const std::map<std::string, std::string>& metadata);

/// The LibTorch type of a safetensors dtype name; none for a name accel does not read.
ACCEL_DECL std::optional<c10::ScalarType> scalar_type_of(std::string_view dtype);

/// The safetensors name of `type`; throws naming `what` where safetensors has none.
ACCEL_DECL std::string dtype_name(c10::ScalarType type, const std::string& what);

}  // namespace detail

/// Writes the tensors `tensors` describes to `path`, atomically, without holding them together: `write_data(i,
/// out)` writes tensor i's bytes (`out.write(pointer, bytes)`, exactly `tensors[i].bytes` of them) in turn. The file
/// is the one `save` writes for the same tensors (`accel merge-weights` streams through it).
template <class WriteData>
::accel::detail::written_file save_streamed(const std::filesystem::path& path,
                                            const std::vector<detail::stored_tensor>& tensors, WriteData&& write_data,
                                            const std::map<std::string, std::string>& metadata = {{"format", "pt"}}) {
  const auto header = detail::header_text(tensors, metadata);
  return ::accel::detail::write_atomically<checkpoint_error>(path, [&](auto& out) {
    const std::uint64_t length = header.size();
    out.write(&length, sizeof length);
    out.write(header);
    for (std::size_t i = 0; i < tensors.size(); ++i) write_data(i, out);
  });
}

/// Writes `tensors` (any device, dtype among F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL) to `path`, atomically.
ACCEL_DECL ::accel::detail::written_file save(const std::filesystem::path& path, const tensor_list& tensors,
                                              const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

/// Reads every tensor of a safetensors file's bytes, `file` (on the CPU), validating it first; `where` names the
/// file in errors.
ACCEL_DECL tensor_list parse(std::string_view file, const std::string& where,
                             std::map<std::string, std::string>* metadata = nullptr);

/// Reads every tensor of the file at `path` (on the CPU), validating it first.
inline tensor_list load(const std::filesystem::path& path, std::map<std::string, std::string>* metadata = nullptr) {
  return parse(detail::read_file(path), path.string(), metadata);
}

}  // namespace safetensors
}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/safetensors.ipp"
#endif
