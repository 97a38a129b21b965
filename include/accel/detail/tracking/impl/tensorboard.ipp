/// \file
/// What tensorboard.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../tensorboard.hpp"

namespace accel::detail {

std::string tfrecord(std::string_view data) {
  const auto length = raw_bytes(static_cast<std::uint64_t>(data.size()));
  return length + raw_bytes(masked_crc32c(length)) + std::string(data) + raw_bytes(masked_crc32c(data));
}

protobuf_message& protobuf_message::varint(int field, std::uint64_t value) {
  key(field, 0);
  append_varint(value);
  return *this;
}

protobuf_message& protobuf_message::fixed64(int field, double value) {
  key(field, 1);
  bytes_ += raw_bytes(value);
  return *this;
}

protobuf_message& protobuf_message::fixed32(int field, float value) {
  key(field, 5);
  bytes_ += raw_bytes(value);
  return *this;
}

protobuf_message& protobuf_message::bytes(int field, std::string_view value) {
  key(field, 2);
  append_varint(value.size());
  bytes_ += value;
  return *this;
}

void protobuf_message::key(int field, int wire_type) {
  append_varint(static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire_type));
}

void protobuf_message::append_varint(std::uint64_t value) {
  for (; value >= 0x80; value >>= 7) bytes_ += static_cast<char>((value & 0x7F) | 0x80);
  bytes_ += static_cast<char>(value);
}

std::string scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value) {
  const auto summary_value = protobuf_message().bytes(1, tag).fixed32(2, value).str();
  const auto summary = protobuf_message().bytes(1, summary_value).str();
  return protobuf_message().fixed64(1, wall_time).int64(2, step).bytes(5, summary).str();
}

std::string event_file_name(std::int64_t unix_seconds) {
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0 || host[0] == '\0') std::strcpy(host.data(), "localhost");
  // The process id and a count make two runs started within the same second get two files (as SummaryWriter's).
  static std::atomic<int> files_opened{0};
  return "events.out.tfevents." + std::to_string(unix_seconds) + "." + host.data() + "." + std::to_string(::getpid()) +
         "." + std::to_string(files_opened++);
}

}  // namespace accel::detail
