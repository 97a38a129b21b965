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

#include "../config.hpp"

namespace accel::detail {

/// One entry of a directory, answering what `std::filesystem::directory_entry` answers.
class directory_entry {
 public:
  ACCEL_DECL explicit directory_entry(std::filesystem::path path);
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

[[noreturn]] ACCEL_DECL void throw_filesystem_error(const char* what, const std::filesystem::path& path);

/// The entries of `directory` but `.` and `..`, in the order the file system gives them; throws
/// `std::filesystem::filesystem_error` where it cannot be read (as `std::filesystem::directory_iterator`).
ACCEL_DECL std::vector<directory_entry> directory_entries(const std::filesystem::path& directory);

/// Removes `path` and, for a directory (not a link to one), everything under it (as `std::filesystem::remove_all`;
/// nothing there is no error).
ACCEL_DECL void remove_tree(const std::filesystem::path& path);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/directory_entries.ipp"
#endif
