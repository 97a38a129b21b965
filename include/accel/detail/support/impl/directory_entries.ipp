/// \file
/// What directory_entries.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../directory_entries.hpp"

namespace accel::detail {

directory_entry::directory_entry(std::filesystem::path path) : path_(std::move(path)) {
  struct stat own{};
  link_ = ::lstat(path_.c_str(), &own) == 0 && S_ISLNK(own.st_mode);
  struct stat target{};
  if (::stat(path_.c_str(), &target) == 0) {
    regular_ = S_ISREG(target.st_mode);
    directory_ = S_ISDIR(target.st_mode);
  }
}

void throw_filesystem_error(const char* what, const std::filesystem::path& path) {
  throw std::filesystem::filesystem_error(what, path, std::error_code(errno, std::generic_category()));
}

std::vector<directory_entry> directory_entries(const std::filesystem::path& directory) {
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

void remove_tree(const std::filesystem::path& path) {
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
