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
  [[nodiscard]] bool read_range(const std::string& name, std::uint64_t offset, std::uint64_t bytes, void* into) const {
    const auto found = fds_.find(name);
    if (found == fds_.end()) return false;
    auto* out = static_cast<char*>(into);
    for (std::uint64_t done = 0; done < bytes;) {
      const auto got = ::pread(found->second, out + done, bytes - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      done += static_cast<std::uint64_t>(got);
    }
    return true;
  }
  /// `crc` extended (crc32c_extend) by bytes [offset, offset + bytes) of `name`, looked at where they lie in the
  /// page cache, 4 MiB mapped at a time, rather than read: a load checks a file whole before it reads the file's
  /// bytes into the parameters, so that they are read once. None if it was not opened, is shorter now (its size is
  /// checked first: a mapping past the end would fault) or cannot be mapped.
  [[nodiscard]] std::optional<std::uint32_t> checksum_range(const std::string& name, std::uint64_t offset,
                                                            std::uint64_t bytes, std::uint32_t crc) const {
    const auto found = fds_.find(name);
    const auto now = size(name);
    if (found == fds_.end() || !now || *now < offset + bytes) return std::nullopt;
    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    constexpr std::uint64_t window = std::uint64_t{4} << 20;
    for (std::uint64_t done = 0; done < bytes;) {
      const auto at = offset + done, start = at / page * page, length = std::min(window, bytes - done);
      const auto mapped_length = static_cast<std::size_t>(at - start + length);
      void* mapped = ::mmap(nullptr, mapped_length, PROT_READ, MAP_SHARED | MAP_POPULATE, found->second,
                            static_cast<off_t>(start));
      if (mapped == MAP_FAILED) return std::nullopt;
      crc = crc32c_extend(crc, std::string_view(static_cast<const char*>(mapped) + (at - start), length));
      ::munmap(mapped, mapped_length);
      done += length;
    }
    return crc;
  }
  /// The size of `name` now (fstat of the file opened); none if it was not opened.
  [[nodiscard]] std::optional<std::uint64_t> size(const std::string& name) const {
    const auto found = fds_.find(name);
    struct stat status{};
    if (found == fds_.end() || ::fstat(found->second, &status) != 0) return std::nullopt;
    return static_cast<std::uint64_t>(status.st_size);
  }
  /// The size and CRC-32C of `name`, read in pieces of 1 MiB (never held whole); none if it was not opened.
  [[nodiscard]] std::optional<std::pair<std::uint64_t, std::uint32_t>> size_and_checksum(
      const std::string& name) const {
    const auto found = fds_.find(name);
    if (found == fds_.end()) return std::nullopt;
    std::vector<char> buffer(1 << 20);
    std::uint64_t size = 0;
    std::uint32_t crc = 0;
    for (;;) {
      const auto got = ::pread(found->second, buffer.data(), buffer.size(), static_cast<off_t>(size));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return std::nullopt;
      if (got == 0) return std::pair{size, crc};
      crc = crc32c_extend(crc, std::string_view(buffer.data(), static_cast<std::size_t>(got)));
      size += static_cast<std::uint64_t>(got);
    }
  }

  /// The whole content of `name`, or none if it was not opened (or cannot be read now).
  [[nodiscard]] std::optional<std::string> read(const std::string& name) const {
    const auto found = fds_.find(name);
    if (found == fds_.end()) return std::nullopt;
    std::string bytes;
    char buffer[1 << 16];
    for (off_t offset = 0;;) {
      const auto got = ::pread(found->second, buffer, sizeof buffer, offset);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return std::nullopt;
      if (got == 0) return bytes;
      bytes.append(buffer, static_cast<std::size_t>(got));
      offset += got;
    }
  }

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

  [[nodiscard]] std::string text() const {
    std::string text = "accel checkpoint checksums 1\n";
    for (const auto& [name, file] : files_)
      text += hex(file.crc32c) + " " + std::to_string(file.size) + " " + name + "\n";
    return text + "end " + hex(crc32c(text)) + "\n";
  }

  /// The manifest in `text`; `where` names its file in errors. Its last line checks the others, so a damaged
  /// manifest is refused as a whole.
  static checkpoint_manifest parse(std::string_view text, const std::string& where) {
    const auto damaged = [&where](const std::string& why) {
      return checkpoint_error("accel::load_state: " + where + " is damaged (" + why +
                              "); the checkpoint cannot be trusted");
    };
    const auto last = text.size() > 1 ? text.rfind('\n', text.size() - 2) : std::string_view::npos;
    if (text.empty() || text.back() != '\n' || last == std::string_view::npos) throw damaged("it is truncated");
    const auto body = text.substr(0, last + 1);
    std::uint32_t stated = 0;
    if (text.size() - last != 14 || !parse_hex(text.substr(last + 1), "end ", stated))
      throw damaged("its last line is not \"end <checksum>\"");
    if (stated != crc32c(body)) throw damaged("its own checksum does not match");
    checkpoint_manifest manifest;
    std::size_t begin = body.find('\n') + 1;
    if (body.substr(0, begin) != "accel checkpoint checksums 1\n") throw damaged("an unknown first line");
    while (begin < body.size()) {
      const auto end = body.find('\n', begin);
      const auto line = body.substr(begin, end - begin);
      written_file file;
      const auto size_at = line.find(' ', 9);
      const auto size = size_at == std::string_view::npos
                            ? std::from_chars_result{nullptr, std::errc::invalid_argument}
                            : std::from_chars(line.data() + 9, line.data() + size_at, file.size);
      if (!parse_hex(line, "", file.crc32c) || size.ec != std::errc{} || size.ptr != line.data() + size_at ||
          size_at + 1 == line.size() || line.find('/', size_at) != std::string_view::npos)
        throw damaged("a line is not \"<checksum> <size> <file>\"");
      file.name = std::string(line.substr(size_at + 1));
      manifest.add(file);
      begin = end + 1;
    }
    // from_chars also reads "A" as 10: a flipped case bit in the last line would otherwise pass unnoticed.
    if (manifest.text() != text) throw damaged("it is not in the form accel writes");
    return manifest;
  }

 private:
  static std::string hex(std::uint32_t value) {
    char digits[9];
    std::snprintf(digits, sizeof digits, "%08x", value);
    return digits;
  }
  // "<prefix><8 hex digits>" followed by a space or a newline.
  static bool parse_hex(std::string_view text, std::string_view prefix, std::uint32_t& value) {
    if (text.substr(0, prefix.size()) != prefix || text.size() < prefix.size() + 9) return false;
    const auto digits = text.substr(prefix.size(), 8);
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + 8, value, 16);
    const char after = text[prefix.size() + 8];
    return error == std::errc{} && end == digits.data() + 8 && (after == ' ' || after == '\n');
  }

  std::map<std::string, written_file> files_;
  std::shared_ptr<const opened_files> opened_;
};

/// The manifest of the checkpoint in `directory`, or none for one written before accel had checksums (v0.1). The
/// files it lists are opened at once, relative to the same directory (`opened_files`).
inline std::optional<checkpoint_manifest> read_manifest(const std::filesystem::path& directory) {
  const auto path = directory / checkpoint_files::manifest;
  const int directory_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int fd =
      directory_fd < 0 ? -1 : ::openat(directory_fd, checkpoint_files::manifest.data(), O_RDONLY | O_CLOEXEC);
  const auto close_directory = [directory_fd] {
    if (directory_fd >= 0) ::close(directory_fd);
  };
  if (fd < 0) {
    close_directory();
    if (std::filesystem::exists(path))
      throw checkpoint_error("accel::load_state: cannot read " + path.string() + " (no permission?)");
    return std::nullopt;
  }
  auto files = std::make_shared<opened_files>();
  files->add(std::string(checkpoint_files::manifest), fd);
  const auto text = files->read(std::string(checkpoint_files::manifest));
  if (!text) {
    close_directory();
    throw checkpoint_error("accel::load_state: cannot read " + path.string());
  }
  auto manifest = checkpoint_manifest::parse(*text, path.string());
  for (const auto& [name, file] : manifest.files())
    if (const int listed = ::openat(directory_fd, name.c_str(), O_RDONLY | O_CLOEXEC); listed >= 0)
      files->add(name, listed);  // a file missing now is reported when it is read
  close_directory();
  manifest.keep_open(std::move(files));
  return manifest;
}

/// The refusal of a checkpoint without a manifest (by `call`): nothing vouches for its files.
inline checkpoint_error unchecked_checkpoint(const std::filesystem::path& directory, const std::string& call) {
  return checkpoint_error(call + ": " + directory.string() + " has no " + std::string(checkpoint_files::manifest) +
                          ": it was written by accel 0.1 (or its save did not complete), and nothing checks its files "
                          "before LibTorch parses them (a damaged one can crash the process); if you trust it, load "
                          "it once with load_state(dir, {.allow_unchecked = true}) and save it again, which writes "
                          "the manifest");
}

/// The refusal of a sharded checkpoint without its manifest: accel has always written one with the sharded format,
/// so this one is incomplete or damaged, and `allow_unchecked` does not apply.
inline checkpoint_error sharded_without_manifest(const std::filesystem::path& directory) {
  return checkpoint_error("accel: " + directory.string() + " is a sharded checkpoint without its " +
                          std::string(checkpoint_files::manifest) +
                          ", which every sharded checkpoint has: its save did not complete, or the file was lost; it "
                          "cannot be checked, and is not loaded");
}

/// What `manifest` says was saved as `name`; a file it does not list is refused.
inline const written_file& listed_file(const std::filesystem::path& directory, const std::string& name,
                                       const checkpoint_manifest& manifest) {
  const auto listed = manifest.files().find(name);
  if (listed == manifest.files().end())
    throw checkpoint_error("accel::load_state: " + std::string(checkpoint_files::manifest) + " in " +
                           directory.string() + " does not list " + name +
                           ": the directory mixes files of two checkpoints");
  return listed->second;
}

/// Refuses the file at `path` unless its `size` and `crc` (read now) are what was saved.
inline void check_as_saved(const std::filesystem::path& path, const written_file& saved, std::uint64_t size,
                           std::uint32_t crc) {
  if (size == saved.size && crc == saved.crc32c) return;
  throw checkpoint_error("accel::load_state: " + path.string() + " is damaged: its " +
                         (size != saved.size
                              ? std::to_string(size) + " bytes differ from the " + std::to_string(saved.size) + " saved"
                              : std::string("checksum differs from the one saved")) +
                         " (a damaged disk or copy, or files of two checkpoints mixed); nothing was loaded");
}

/// The refusal of a file the checkpoint lacks.
inline checkpoint_error missing_checkpoint_file(const std::filesystem::path& path) {
  return checkpoint_error("accel::load_state: the checkpoint lacks " + path.string() +
                          " (saved by another configuration, or an incomplete copy)");
}

/// Checks `directory/name` against `manifest` as `read_checkpoint_file` does, reading it in pieces: for readers that
/// then take ranges of it (`opened_files::read_range`) and never hold it whole.
inline void check_checkpoint_file(const std::filesystem::path& directory, const std::string& name,
                                  const checkpoint_manifest& manifest) {
  const auto& saved = listed_file(directory, name, manifest);
  const auto read = manifest.opened() ? manifest.opened()->size_and_checksum(name) : std::nullopt;
  if (!read) throw missing_checkpoint_file(directory / name);
  check_as_saved(directory / name, saved, read->first, read->second);
}

/// The bytes of `directory/name`, checked against `manifest` (when the checkpoint has one) before anyone parses them.
inline std::string read_checkpoint_file(const std::filesystem::path& directory, const std::string& name,
                                        const std::optional<checkpoint_manifest>& manifest) {
  const auto path = directory / name;
  auto opened = manifest && manifest->opened() ? manifest->opened()->read(name) : std::nullopt;
  std::ifstream in;
  if (!opened) in.open(path, std::ios::binary);
  if (!opened && !in) throw missing_checkpoint_file(path);
  std::string bytes = opened ? std::move(*opened) : std::string(std::istreambuf_iterator<char>(in), {});
  if (!manifest) return bytes;
  check_as_saved(path, listed_file(directory, name, *manifest), bytes.size(), crc32c(bytes));
  return bytes;
}

}  // namespace accel::detail
