/// \file
/// CRC-32C (Castagnoli): the checksum of TensorBoard's records and of a checkpoint's files.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace accel::detail {

/// One table lookup per byte, over the reflected polynomial.
inline constexpr auto crc32c_table = [] {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t byte = 0; byte < 256; ++byte) {
    std::uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    table[byte] = crc;
  }
  return table;
}();

/// The CRC-32C of what `crc` covered followed by `bytes` (as zlib's `crc32(crc, ...)`: start from 0), so that a
/// file written in pieces gets the checksum of the whole.
constexpr std::uint32_t crc32c_extend(std::uint32_t crc, std::string_view bytes) noexcept {
  crc = ~crc;
  for (const char c : bytes) crc = crc32c_table[(crc ^ static_cast<unsigned char>(c)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

constexpr std::uint32_t crc32c(std::string_view bytes) noexcept { return crc32c_extend(0, bytes); }

}  // namespace accel::detail
