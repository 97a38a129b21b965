/// \file
/// A checkpoint's manifest, `accel_checksums.txt`: the size and CRC-32C of every file `save_state` wrote, checked
/// before a file is parsed, so that a damaged or mixed checkpoint is an error instead of a crash inside LibTorch's
/// reader or a silent load. The format (docs/checkpoint-format.md):
///
///     accel checkpoint checksums 1
///     <crc32c, 8 hex digits> <size in bytes> <file name>      (one line per file)
///     end <crc32c of every byte before this line, 8 hex digits>
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "../support/atomic_file.hpp"
#include "../support/crc32c.hpp"
#include "format.hpp"

namespace accel::detail {

/// The files of one checkpoint directory, opened together (by `read_manifest`): a save that then replaces the
/// directory (its staging directory exchanged with it, the old files removed) cannot change what these read, so a
/// load reads one checkpoint whole however long it takes.
class opened_files {
 public:
  opened_files() = default;
  opened_files(const opened_files&) = delete;
  opened_files& operator=(const opened_files&) = delete;
  ~opened_files() {
    for (const auto& [name, fd] : fds_) ::close(fd);
  }
  void add(const std::string& name, int fd) { fds_.emplace(name, fd); }

  /// Reads `bytes` bytes of `name` from `offset` into `into`; false if it was not opened, cannot be read, or ends
  /// first. Only those bytes are read (pread): a process loading its slices reads no more of a file.
  [[nodiscard]] ACCEL_DECL bool read_range(const std::string& name, std::uint64_t offset, std::uint64_t bytes,
                                           void* into) const;
  /// `crc` extended (crc32c_extend) by bytes [offset, offset + bytes) of `name`, looked at where they lie in the
  /// page cache, 4 MiB mapped at a time, rather than read: a load checks a file whole before it reads the file's
  /// bytes into the parameters, so that they are read once. None if it was not opened, is shorter now (its size is
  /// checked first: a mapping past the end would fault) or cannot be mapped.
  [[nodiscard]] ACCEL_DECL std::optional<std::uint32_t> checksum_range(const std::string& name, std::uint64_t offset,
                                                                       std::uint64_t bytes, std::uint32_t crc) const;
  /// The size of `name` now (fstat of the file opened); none if it was not opened.
  [[nodiscard]] ACCEL_DECL std::optional<std::uint64_t> size(const std::string& name) const;
  /// The size and CRC-32C of `name`, read in pieces of 1 MiB (never held whole); none if it was not opened.
  [[nodiscard]] ACCEL_DECL std::optional<std::pair<std::uint64_t, std::uint32_t>> size_and_checksum(
      const std::string& name) const;

  /// The whole content of `name`, or none if it was not opened (or cannot be read now).
  [[nodiscard]] ACCEL_DECL std::optional<std::string> read(const std::string& name) const;

 private:
  std::map<std::string, int> fds_;
};

class checkpoint_manifest {
 public:
  void add(const written_file& file) { files_[file.name] = file; }
  /// The listed files as they were when the manifest was read (none for a manifest being written).
  [[nodiscard]] const opened_files* opened() const noexcept { return opened_.get(); }
  void keep_open(std::shared_ptr<const opened_files> files) { opened_ = std::move(files); }
  [[nodiscard]] const std::map<std::string, written_file>& files() const noexcept { return files_; }

  [[nodiscard]] ACCEL_DECL std::string text() const;

  /// The manifest in `text`; `where` names its file in errors. Its last line checks the others, so a damaged
  /// manifest is refused as a whole.
  ACCEL_DECL static checkpoint_manifest parse(std::string_view text, const std::string& where);

 private:
  ACCEL_DECL static std::string hex(std::uint32_t value);
  // "<prefix><8 hex digits>" followed by a space or a newline.
  ACCEL_DECL static bool parse_hex(std::string_view text, std::string_view prefix, std::uint32_t& value);

  std::map<std::string, written_file> files_;
  std::shared_ptr<const opened_files> opened_;
};

/// The manifest of the checkpoint in `directory`, or none for one written before accel had checksums (v0.1). The
/// files it lists are opened at once, relative to the same directory (`opened_files`).
ACCEL_DECL std::optional<checkpoint_manifest> read_manifest(const std::filesystem::path& directory);

/// The refusal of a checkpoint without a manifest (by `call`): nothing vouches for its files.
ACCEL_DECL checkpoint_error unchecked_checkpoint(const std::filesystem::path& directory, const std::string& call);

/// The refusal of a sharded checkpoint without its manifest: accel has always written one with the sharded format,
/// so this one is incomplete or damaged, and `allow_unchecked` does not apply.
ACCEL_DECL checkpoint_error sharded_without_manifest(const std::filesystem::path& directory);

/// What `manifest` says was saved as `name`; a file it does not list is refused.
ACCEL_DECL const written_file& listed_file(const std::filesystem::path& directory, const std::string& name,
                                           const checkpoint_manifest& manifest);

/// Refuses the file at `path` unless its `size` and `crc` (read now) are what was saved.
ACCEL_DECL void check_as_saved(const std::filesystem::path& path, const written_file& saved, std::uint64_t size,
                               std::uint32_t crc);

/// The refusal of a file the checkpoint lacks.
ACCEL_DECL checkpoint_error missing_checkpoint_file(const std::filesystem::path& path);

/// Checks `directory/name` against `manifest` as `read_checkpoint_file` does, reading it in pieces: for readers that
/// then take ranges of it (`opened_files::read_range`) and never hold it whole.
ACCEL_DECL void check_checkpoint_file(const std::filesystem::path& directory, const std::string& name,
                                      const checkpoint_manifest& manifest);

/// The bytes of `directory/name`, checked against `manifest` (when the checkpoint has one) before anyone parses them.
ACCEL_DECL std::string read_checkpoint_file(const std::filesystem::path& directory, const std::string& name,
                                            const std::optional<checkpoint_manifest>& manifest);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/manifest.ipp"
#endif
