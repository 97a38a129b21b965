/// \file
/// CRC-32C (Castagnoli): the checksum of TensorBoard's records and of a checkpoint's files.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/// Whether this CPU has SSE4.2's CRC32 instruction, which computes CRC-32C eight bytes at a time (a checkpoint's
/// files are checksummed as they are written and read: the table alone runs at well under 1 GB/s).
inline bool has_crc32_instruction() noexcept {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return has;
}
/// The table's loop on the inverted CRC, by the instruction.
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_by_instruction(std::uint32_t state,
                                                                             std::string_view bytes) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t n = bytes.size();
  std::uint64_t wide = state;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, p, sizeof word);
    wide = __builtin_ia32_crc32di(wide, word);
  }
  state = static_cast<std::uint32_t>(wide);
  for (; n > 0; --n, ++p) state = __builtin_ia32_crc32qi(state, *p);
  return state;
}
#endif

/// The CRC-32C of what `crc` covered followed by `bytes` (as zlib's `crc32(crc, ...)`: start from 0), so that a
/// file written in pieces gets the checksum of the whole.
constexpr std::uint32_t crc32c_extend(std::uint32_t crc, std::string_view bytes) noexcept {
  crc = ~crc;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (!std::is_constant_evaluated() && has_crc32_instruction()) return ~crc32c_by_instruction(crc, bytes);
#endif
  for (const char c : bytes) crc = crc32c_table[(crc ^ static_cast<unsigned char>(c)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

constexpr std::uint32_t crc32c(std::string_view bytes) noexcept { return crc32c_extend(0, bytes); }

}  // namespace accel::detail
