/// \file
/// Listing and removing directories without `std::filesystem`'s directory iterators. LibTorch's wheels export their
/// own copies of those (linked statically from an older libstdc++: pytorch#133437), and the dynamic linker binds
/// them in place of the system's; against GCC 13's libstdc++ the mix crashes (`remove_all` and directory iteration
/// segfaulted on Ubuntu 24.04 with torch 2.11's wheel). POSIX calls have no such twin. `lint.directory_iterators`
/// keeps accel, its tools and tests on these.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

namespace accel::detail {

/// One entry of a directory, answering what `std::filesystem::directory_entry` answers.
class directory_entry {
 public:
  explicit directory_entry(std::filesystem::path path) : path_(std::move(path)) {
    struct stat own{};
    link_ = ::lstat(path_.c_str(), &own) == 0 && S_ISLNK(own.st_mode);
    struct stat target{};
    if (::stat(path_.c_str(), &target) == 0) {
      regular_ = S_ISREG(target.st_mode);
      directory_ = S_ISDIR(target.st_mode);
    }
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// What the entry names, following a symbolic link (as `directory_entry::is_regular_file`).
  [[nodiscard]] bool is_regular_file() const noexcept { return regular_; }
  [[nodiscard]] bool is_directory() const noexcept { return directory_; }
  /// Whether the entry itself is a symbolic link.
  [[nodiscard]] bool is_symlink() const noexcept { return link_; }

 private:
  std::filesystem::path path_;
  bool link_ = false, regular_ = false, directory_ = false;
};

[[noreturn]] inline void throw_filesystem_error(const char* what, const std::filesystem::path& path) {
  throw std::filesystem::filesystem_error(what, path, std::error_code(errno, std::generic_category()));
}

/// The entries of `directory` but `.` and `..`, in the order the file system gives them; throws
/// `std::filesystem::filesystem_error` where it cannot be read (as `std::filesystem::directory_iterator`).
inline std::vector<directory_entry> directory_entries(const std::filesystem::path& directory) {
  const std::unique_ptr<DIR, int (*)(DIR*)> stream(::opendir(directory.c_str()), &::closedir);
  if (!stream) throw_filesystem_error("accel: cannot list the directory", directory);
  std::vector<directory_entry> entries;
  errno = 0;
  while (const dirent* found = ::readdir(stream.get())) {
    const std::string name = found->d_name;
    if (name != "." && name != "..") entries.emplace_back(directory / name);
    errno = 0;
  }
  if (errno != 0) throw_filesystem_error("accel: cannot list the directory", directory);
  return entries;
}

/// Removes `path` and, for a directory (not a link to one), everything under it (as `std::filesystem::remove_all`;
/// nothing there is no error).
inline void remove_tree(const std::filesystem::path& path) {
  struct stat own{};
  if (::lstat(path.c_str(), &own) != 0) {
    if (errno == ENOENT) return;
    throw_filesystem_error("accel: cannot remove", path);
  }
  if (S_ISDIR(own.st_mode)) {
    for (const auto& entry : directory_entries(path)) remove_tree(entry.path());
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) throw_filesystem_error("accel: cannot remove", path);
  } else if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    throw_filesystem_error("accel: cannot remove", path);
  }
}

}  // namespace accel::detail
