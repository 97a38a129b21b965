/// \file
/// What safetensors.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../safetensors.hpp"

namespace accel::safetensors::detail {

const std::map<c10::ScalarType, std::string>& dtype_names() {
  static const std::map<c10::ScalarType, std::string> names = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"}, {at::kLong, "I64"},
      {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},  {at::kByte, "U8"},       {at::kBool, "BOOL"}};
  return names;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw checkpoint_error("accel: cannot open " + path.string() + " for reading (missing file?)");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string header_text(const std::vector<stored_tensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  std::int64_t offset = 0;
  for (const auto& t : tensors) {
    std::string shape;
    for (auto d : t.shape) ::accel::detail::append_item(shape, std::to_string(d), ",");
    header += ::accel::detail::json_string(t.name) + ":{\"dtype\":\"" + t.dtype + "\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.bytes) + "]},";
    offset += t.bytes;
  }
  header += "\"__metadata__\":{";
  for (const auto& [key, value] : metadata)
    header += ::accel::detail::json_string(key) + ":" + ::accel::detail::json_string(value) + ",";
  if (header.back() == ',') header.pop_back();
  header += "}}";
  while (header.size() % 8 != 0) header += ' ';  // the data starts 8-byte aligned, as the reference writer does
  return header;
}

std::optional<c10::ScalarType> scalar_type_of(std::string_view dtype) {
  for (const auto& [type, name] : dtype_names())
    if (name == dtype) return type;
  return std::nullopt;
}

std::string dtype_name(c10::ScalarType type, const std::string& what) {
  const auto found = dtype_names().find(type);
  if (found == dtype_names().end())
    throw checkpoint_error("accel: cannot write " + what + ": safetensors has no " + std::string(c10::toString(type)) +
                           " type");
  return found->second;
}
}  // namespace accel::safetensors::detail

namespace accel::safetensors {

::accel::detail::written_file save(const std::filesystem::path& path, const tensor_list& tensors,
                                   const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> contiguous;
  std::vector<detail::stored_tensor> stored;
  for (const auto& [name, tensor] : tensors) {
    auto dtype = detail::dtype_name(tensor.scalar_type(), "tensor " + name + " to " + path.string());
    contiguous.push_back(tensor.detach().to(at::kCPU).contiguous());
    stored.push_back(
        {name, std::move(dtype), tensor.sizes().vec(), static_cast<std::int64_t>(contiguous.back().nbytes())});
  }
  return save_streamed(
      path, stored, [&](std::size_t i, auto& out) { out.write(contiguous[i].data_ptr(), contiguous[i].nbytes()); },
      metadata);
}

tensor_list parse(std::string_view file, const std::string& where, std::map<std::string, std::string>* metadata) {
  if (file.size() < 8)
    throw checkpoint_error("accel: " + where + " is truncated: shorter than the 8-byte header length");
  std::uint64_t length = 0;
  std::memcpy(&length, file.data(), sizeof length);
  detail::check_header_length(length, file.size(), where);
  std::vector<std::pair<std::string, detail::header_parser::entry>> entries;
  std::map<std::string, std::string> meta;
  detail::header_parser(std::string(file.data() + 8, length), where).parse(entries, meta);
  detail::check_ranges(entries, file.size() - 8 - length, where);
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
    const auto numel = detail::element_count(e.shape, name, where);
    std::int64_t bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<std::int64_t>(c10::elementSize(*type)), &bytes) ||
        bytes != e.offsets[1] - e.offsets[0])
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

}  // namespace accel::safetensors
