/// \file
/// What format.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../format.hpp"

namespace accel::detail::checkpoint_files {

std::string numbered(std::string_view kind, std::size_t i, std::string_view extension) {
  std::string name(kind);  // appended in place: GCC 12 warns falsely (-Wstringop-overflow) on kind + (...)
  if (i > 0) name.append("_").append(std::to_string(i));
  return name.append(extension);
}

std::string model(std::size_t i, bool safe_serialization) {
  return safe_serialization ? numbered(kind::model, i, ".safetensors") : numbered(kind::pickled_model, i, ".bin");
}

std::string process(int process_index) {
  return std::string(kind::random_states).append("_").append(std::to_string(process_index)).append(".bin");
}

std::string shard(std::string_view kind, std::size_t i, int process_index) {
  return numbered(kind, i, "").append("_shard_").append(std::to_string(process_index)).append(shard_extension);
}

bool is_numbered(std::string_view text, std::string_view prefix) {
  if (text.substr(0, prefix.size()) != prefix || text.size() == prefix.size()) return false;
  return text.substr(prefix.size()).find_first_not_of("0123456789") == std::string_view::npos;
}

bool is_checkpoint_file(std::string_view name) {
  if (const auto temporary = name.rfind(".tmp");
      temporary != std::string_view::npos && is_numbered(name.substr(temporary), ".tmp"))
    name = name.substr(0, temporary);
  if (name == accel_state || name == manifest || name == shard_layout) return true;
  const auto dot = name.find('.');
  if (dot == std::string_view::npos) return false;
  auto stem = name.substr(0, dot);
  const auto extension = name.substr(dot);
  if (extension == ".bin" && is_numbered(stem, std::string(kind::random_states) + "_")) return true;
  if (const auto shard_at = stem.rfind("_shard_"); shard_at != std::string_view::npos && extension == shard_extension) {
    if (!is_numbered(stem.substr(shard_at + 1), "shard_")) return false;
    stem = stem.substr(0, shard_at);
    for (const auto kind : sharded_kinds)
      if (is_kind_numbered(stem, kind)) return true;
    return false;
  }
  for (const auto& file : numbered_files)
    if (extension == file.extension && is_kind_numbered(stem, file.kind)) return true;
  return false;
}

}  // namespace accel::detail::checkpoint_files
