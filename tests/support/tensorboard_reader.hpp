// A reader of TensorBoard event files for the tests, written from the formats' documentation and sharing no code
// with accel's writer (include/accel/detail/tracking/tensorboard.hpp):
//   - TFRecord (tensorflow/core/lib/io/record_writer.h): uint64 length, uint32 masked CRC-32C of the length,
//     the data, uint32 masked CRC-32C of the data; all little-endian; masked = ((crc >> 15) | (crc << 17)) +
//     0xa282ead8.
//   - CRC-32C: RFC 3720 appendix B.4 (reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF), here
//     bit by bit rather than by table.
//   - Protocol buffers' wire format (protobuf.dev/programming-guides/encoding): keys are varints
//     (field << 3 | wire type); wire types 0 varint, 1 fixed 64-bit, 2 length-delimited, 5 fixed 32-bit.
//   - Event {wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5};
//     Summary {repeated Value value = 1}; Value {tag = 1 (string), simple_value = 2 (float)}.
#pragma once

#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <accel/detail/support/directory_entries.hpp>

namespace tensorboard_reader {

struct read_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct scalar {
  std::string tag;
  float value = 0;
};

struct event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;
  std::vector<scalar> scalars;
};

inline std::uint32_t crc32c(const std::string& bytes) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (const unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

inline std::uint32_t masked_crc32c(const std::string& bytes) {
  const auto crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/// The unsigned little-endian number in `bytes[at, at + n)`.
inline std::uint64_t little_endian(const std::string& bytes, std::size_t at, std::size_t n) {
  if (at + n > bytes.size())
    throw read_error("truncated: " + std::to_string(n) + " bytes expected at offset " + std::to_string(at));
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < n; ++i) value |= std::uint64_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
  return value;
}

/// The data of every record, each checked against both CRCs.
inline std::vector<std::string> read_records(const std::string& file_bytes) {
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < file_bytes.size()) {
    const auto length = little_endian(file_bytes, at, 8);
    if (little_endian(file_bytes, at + 8, 4) != masked_crc32c(file_bytes.substr(at, 8)))
      throw read_error("length CRC mismatch in the record at offset " + std::to_string(at));
    const auto data_at = at + 12;
    if (data_at + length + 4 > file_bytes.size()) throw read_error("truncated record at offset " + std::to_string(at));
    auto data = file_bytes.substr(data_at, length);
    if (little_endian(file_bytes, data_at + length, 4) != masked_crc32c(data))
      throw read_error("data CRC mismatch in the record at offset " + std::to_string(at));
    records.push_back(std::move(data));
    at = data_at + length + 4;
  }
  return records;
}

/// Reads one message's fields in order.
class fields {
 public:
  explicit fields(std::string bytes) : bytes_(std::move(bytes)) {}
  [[nodiscard]] bool done() const { return at_ >= bytes_.size(); }
  /// The next key: (field number, wire type).
  std::pair<int, int> key() {
    const auto k = varint();
    return {static_cast<int>(k >> 3), static_cast<int>(k & 7)};
  }
  std::uint64_t varint() {
    std::uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) throw read_error("truncated varint");
      const auto byte = static_cast<unsigned char>(bytes_[at_++]);
      value |= std::uint64_t{byte & 0x7Fu} << shift;
      if ((byte & 0x80u) == 0) return value;
    }
    throw read_error("varint longer than 10 bytes");
  }
  double fixed64() { return std::bit_cast<double>(take_fixed(8)); }
  float fixed32() { return std::bit_cast<float>(static_cast<std::uint32_t>(take_fixed(4))); }
  std::string length_delimited() {
    const auto n = varint();
    if (at_ + n > bytes_.size()) throw read_error("truncated length-delimited field");
    auto value = bytes_.substr(at_, n);
    at_ += n;
    return value;
  }
  void skip(int wire_type) {
    switch (wire_type) {
      case 0:
        varint();
        return;
      case 1:
        take_fixed(8);
        return;
      case 2:
        length_delimited();
        return;
      case 5:
        take_fixed(4);
        return;
      default:
        throw read_error("unknown wire type " + std::to_string(wire_type));
    }
  }

 private:
  std::uint64_t take_fixed(std::size_t n) {
    const auto value = little_endian(bytes_, at_, n);
    at_ += n;
    return value;
  }
  std::string bytes_;
  std::size_t at_ = 0;
};

inline void expect_wire_type(int field, int wire_type, int expected) {
  if (wire_type != expected)
    throw read_error("field " + std::to_string(field) + " has wire type " + std::to_string(wire_type) + ", expected " +
                     std::to_string(expected));
}

inline scalar decode_value(std::string bytes) {
  scalar value;
  for (fields f(std::move(bytes)); !f.done();) {
    const auto [field, wire] = f.key();
    if (field == 1) {
      expect_wire_type(field, wire, 2);
      value.tag = f.length_delimited();
    } else if (field == 2) {
      expect_wire_type(field, wire, 5);
      value.value = f.fixed32();
    } else
      f.skip(wire);
  }
  return value;
}

inline std::vector<scalar> decode_summary(std::string bytes) {
  std::vector<scalar> values;
  for (fields f(std::move(bytes)); !f.done();) {
    const auto [field, wire] = f.key();
    if (field == 1) {
      expect_wire_type(field, wire, 2);
      values.push_back(decode_value(f.length_delimited()));
    } else
      f.skip(wire);
  }
  return values;
}

inline event decode_event(std::string bytes) {
  event e;
  for (fields f(std::move(bytes)); !f.done();) {
    const auto [field, wire] = f.key();
    if (field == 1) {
      expect_wire_type(field, wire, 1);
      e.wall_time = f.fixed64();
    } else if (field == 2) {
      expect_wire_type(field, wire, 0);
      e.step = static_cast<std::int64_t>(f.varint());
    } else if (field == 3) {
      expect_wire_type(field, wire, 2);
      e.file_version = f.length_delimited();
    } else if (field == 5) {
      expect_wire_type(field, wire, 2);
      e.scalars = decode_summary(f.length_delimited());
    } else
      f.skip(wire);
  }
  return e;
}

inline std::string file_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw read_error("cannot open " + file.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The one event file in `directory`.
inline std::filesystem::path event_file(const std::filesystem::path& directory) {
  std::vector<std::filesystem::path> found;
  for (const auto& entry : accel::detail::directory_entries(directory))
    if (entry.path().filename().string().starts_with("events.out.tfevents.")) found.push_back(entry.path());
  if (found.size() != 1)
    throw read_error(std::to_string(found.size()) + " event files in " + directory.string() + ", expected one");
  return found.front();
}

inline std::vector<event> read_events(const std::string& bytes) {
  std::vector<event> events;
  for (auto& record : read_records(bytes)) events.push_back(decode_event(std::move(record)));
  return events;
}
inline std::vector<event> read_events(const std::filesystem::path& file) { return read_events(file_bytes(file)); }

}  // namespace tensorboard_reader
