/// \file
/// Writing a file so that readers see the old file or the whole new one, never a part, and so that once written it
/// survives a crash: the content goes to a temporary file beside it, is synced, renamed over it (rename is atomic
/// within a file system), and the directory is synced. Every error is the caller's exception, naming the file:
/// nothing here throws from a destructor or aborts (as LibTorch's archive writer does on a full disk).
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "crc32c.hpp"
#include "write_pacing.hpp"

namespace accel::detail {

/// What was written: the file's name, size and CRC-32C (a checkpoint's manifest lists them).
struct written_file {
  std::string name;
  std::uint64_t size = 0;
  std::uint32_t crc32c = 0;
};

/// An open file written in pieces: every write is checked (a short write or an error throws `Error` naming the
/// file and the system's reason) and counted into the size and checksum.
template <class Error>
class file_writer {
 public:
  explicit file_writer(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd_ < 0) fail("create");
  }
  file_writer(const file_writer&) = delete;
  file_writer& operator=(const file_writer&) = delete;
  ~file_writer() {
    if (fd_ >= 0) ::close(fd_);
  }

  void write(std::string_view bytes) {
    if (write_pacing::active()) {  // a background save's thread: in pieces, pausing after each
      for (; bytes.size() > write_pacing::piece_bytes; bytes.remove_prefix(write_pacing::piece_bytes))
        write_piece(bytes.substr(0, write_pacing::piece_bytes));
      return write_piece(bytes);
    }
    write_piece(bytes);
  }
  void write(const void* data, std::size_t size) { write(std::string_view(static_cast<const char*>(data), size)); }

  /// Syncs and closes the file; returns what was written.
  written_file finish() {
    if (::fsync(fd_) != 0) fail("sync");
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail("close");
    return written_;
  }

 private:
  void write_piece(std::string_view bytes) {
    write_pacing::pause();
    written_.crc32c = crc32c_extend(written_.crc32c, bytes);
    written_.size += bytes.size();
    while (!bytes.empty()) {
      const auto n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("write");
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  [[noreturn]] void fail(const char* what) const {
    throw Error("accel: cannot " + std::string(what) + " " + path_.string() + ": " + std::strerror(errno) +
                (errno == ENOSPC || errno == EFBIG || errno == EDQUOT ? " (free some space)" : ""));
  }

  std::filesystem::path path_;
  int fd_ = -1;
  written_file written_;
};

/// Makes the entries of `directory` (files created, renamed or removed in it) survive a crash.
template <class Error>
void sync_directory(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (!synced) throw Error("accel: cannot sync the directory " + directory.string() + ": " + std::strerror(error));
}

/// Calls `write(writer)` on the file `temporary` beside `path` (`file_writer<Error>&`), syncs it, renames it to
/// `path` and syncs the directory. Throws `Error` naming the file when any of it fails; the temporary file is removed
/// then, and a file already at `path` is left as it was.
template <class Error, class Write>
written_file write_atomically(const std::filesystem::path& path, const std::filesystem::path& temporary,
                              Write&& write) {
  try {
    written_file written;
    {
      file_writer<Error> out(temporary);
      std::forward<Write>(write)(out);
      written = out.finish();
    }
    std::error_code error;
    std::filesystem::rename(temporary, path, error);
    if (error) throw Error("accel: cannot write " + path.string() + ": " + error.message());
    sync_directory<Error>(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
    written.name = path.filename().string();
    return written;
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
}
/// The same through `PATH.tmpPID`.
template <class Error, class Write>
written_file write_atomically(const std::filesystem::path& path, Write&& write) {
  return write_atomically<Error>(path, path.string() + ".tmp" + std::to_string(::getpid()), std::forward<Write>(write));
}

}  // namespace accel::detail
