/// \file
/// TensorBoard's event file format, written without TensorFlow or protobuf: a TFRecord stream of `Event` protocol
/// buffers. Each record is
///
///     uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
///
/// with masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8. The messages used (tensorflow/core/util/event.proto
/// and tensorflow/core/framework/summary.proto):
///
///     Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
///     Summary { repeated Value value = 1; }
///     Value   { string tag = 1; float simple_value = 2; }
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "../config.hpp"
#include "../support/crc32c.hpp"

namespace accel::detail {

static_assert(std::endian::native == std::endian::little, "accel writes TensorBoard files as little-endian bytes");

/// TFRecord stores checksums masked, so that a CRC computed over data that itself holds CRCs stays meaningful.
constexpr std::uint32_t masked_crc32c(std::string_view bytes) noexcept {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/// The little-endian bytes of a fixed-size number (the platform is little-endian: see the static_assert).
template <class Number>
std::string raw_bytes(Number value) {
  std::string bytes(sizeof value, '\0');
  std::memcpy(bytes.data(), &value, sizeof value);
  return bytes;
}

/// One TFRecord: `data` framed by its length and the two checksums.
ACCEL_DECL std::string tfrecord(std::string_view data);

/// Appends protocol buffer fields to a message: a field is a key (number << 3 | wire type), then its value.
class protobuf_message {
 public:
  ACCEL_DECL protobuf_message& varint(int field, std::uint64_t value);
  /// int64 fields are varints of the two's complement (10 bytes when negative).
  protobuf_message& int64(int field, std::int64_t value) { return varint(field, static_cast<std::uint64_t>(value)); }
  ACCEL_DECL protobuf_message& fixed64(int field, double value);
  ACCEL_DECL protobuf_message& fixed32(int field, float value);
  /// Strings and embedded messages alike: length-delimited.
  ACCEL_DECL protobuf_message& bytes(int field, std::string_view value);
  [[nodiscard]] const std::string& str() const noexcept { return bytes_; }

 private:
  ACCEL_DECL void key(int field, int wire_type);
  ACCEL_DECL void append_varint(std::uint64_t value);
  std::string bytes_;
};

/// The Event every event file starts with: it names the format version TensorBoard expects.
inline std::string file_version_event(double wall_time) {
  return protobuf_message().fixed64(1, wall_time).bytes(3, "brain.Event:2").str();
}

/// An Event holding one scalar (what PyTorch's `SummaryWriter.add_scalar` writes).
ACCEL_DECL std::string scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value);

/// `events.out.tfevents.{unix seconds}.{hostname}`, the name TensorBoard looks for.
ACCEL_DECL std::string event_file_name(std::int64_t unix_seconds);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/tensorboard.ipp"
#endif
