/// \file
/// What manifest.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../manifest.hpp"

namespace accel::detail {

bool opened_files::read_range(const std::string& name, std::uint64_t offset, std::uint64_t bytes, void* into) const {
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

std::optional<std::uint32_t> opened_files::checksum_range(const std::string& name, std::uint64_t offset,
                                                          std::uint64_t bytes, std::uint32_t crc) const {
  const auto found = fds_.find(name);
  const auto now = size(name);
  if (found == fds_.end() || !now || *now < offset + bytes) return std::nullopt;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  constexpr std::uint64_t window = std::uint64_t{4} << 20;
  for (std::uint64_t done = 0; done < bytes;) {
    const auto at = offset + done, start = at / page * page, length = std::min(window, bytes - done);
    const auto mapped_length = static_cast<std::size_t>(at - start + length);
    void* mapped =
        ::mmap(nullptr, mapped_length, PROT_READ, MAP_SHARED | MAP_POPULATE, found->second, static_cast<off_t>(start));
    if (mapped == MAP_FAILED) return std::nullopt;
    crc = crc32c_extend(crc, std::string_view(static_cast<const char*>(mapped) + (at - start), length));
    ::munmap(mapped, mapped_length);
    done += length;
  }
  return crc;
}

std::optional<std::uint64_t> opened_files::size(const std::string& name) const {
  const auto found = fds_.find(name);
  struct stat status{};
  if (found == fds_.end() || ::fstat(found->second, &status) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(status.st_size);
}

std::optional<std::pair<std::uint64_t, std::uint32_t>> opened_files::size_and_checksum(const std::string& name) const {
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

std::optional<std::string> opened_files::read(const std::string& name) const {
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

std::string checkpoint_manifest::text() const {
  std::string text = "accel checkpoint checksums 1\n";
  for (const auto& [name, file] : files_)
    text += hex(file.crc32c) + " " + std::to_string(file.size) + " " + name + "\n";
  return text + "end " + hex(crc32c(text)) + "\n";
}

checkpoint_manifest checkpoint_manifest::parse(std::string_view text, const std::string& where) {
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

std::string checkpoint_manifest::hex(std::uint32_t value) {
  char digits[9];
  std::snprintf(digits, sizeof digits, "%08x", value);
  return digits;
}

bool checkpoint_manifest::parse_hex(std::string_view text, std::string_view prefix, std::uint32_t& value) {
  if (text.substr(0, prefix.size()) != prefix || text.size() < prefix.size() + 9) return false;
  const auto digits = text.substr(prefix.size(), 8);
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + 8, value, 16);
  const char after = text[prefix.size() + 8];
  return error == std::errc{} && end == digits.data() + 8 && (after == ' ' || after == '\n');
}

std::optional<checkpoint_manifest> read_manifest(const std::filesystem::path& directory) {
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

checkpoint_error unchecked_checkpoint(const std::filesystem::path& directory, const std::string& call) {
  return checkpoint_error(call + ": " + directory.string() + " has no " + std::string(checkpoint_files::manifest) +
                          ": it was written by accel 0.1 (or its save did not complete), and nothing checks its files "
                          "before LibTorch parses them (a damaged one can crash the process); if you trust it, load "
                          "it once with load_state(dir, {.allow_unchecked = true}) and save it again, which writes "
                          "the manifest");
}

checkpoint_error sharded_without_manifest(const std::filesystem::path& directory) {
  return checkpoint_error("accel: " + directory.string() + " is a sharded checkpoint without its " +
                          std::string(checkpoint_files::manifest) +
                          ", which every sharded checkpoint has: its save did not complete, or the file was lost; it "
                          "cannot be checked, and is not loaded");
}

const written_file& listed_file(const std::filesystem::path& directory, const std::string& name,
                                const checkpoint_manifest& manifest) {
  const auto listed = manifest.files().find(name);
  if (listed == manifest.files().end())
    throw checkpoint_error("accel::load_state: " + std::string(checkpoint_files::manifest) + " in " +
                           directory.string() + " does not list " + name +
                           ": the directory mixes files of two checkpoints");
  return listed->second;
}

void check_as_saved(const std::filesystem::path& path, const written_file& saved, std::uint64_t size,
                    std::uint32_t crc) {
  if (size == saved.size && crc == saved.crc32c) return;
  throw checkpoint_error("accel::load_state: " + path.string() + " is damaged: its " +
                         (size != saved.size
                              ? std::to_string(size) + " bytes differ from the " + std::to_string(saved.size) + " saved"
                              : std::string("checksum differs from the one saved")) +
                         " (a damaged disk or copy, or files of two checkpoints mixed); nothing was loaded");
}

checkpoint_error missing_checkpoint_file(const std::filesystem::path& path) {
  return checkpoint_error("accel::load_state: the checkpoint lacks " + path.string() +
                          " (saved by another configuration, or an incomplete copy)");
}

void check_checkpoint_file(const std::filesystem::path& directory, const std::string& name,
                           const checkpoint_manifest& manifest) {
  const auto& saved = listed_file(directory, name, manifest);
  const auto read = manifest.opened() ? manifest.opened()->size_and_checksum(name) : std::nullopt;
  if (!read) throw missing_checkpoint_file(directory / name);
  check_as_saved(directory / name, saved, read->first, read->second);
}

std::string read_checkpoint_file(const std::filesystem::path& directory, const std::string& name,
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
