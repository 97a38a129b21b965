/// \file
/// What directory.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../directory.hpp"

namespace accel::detail {

std::filesystem::path checkpoint_directory(const std::filesystem::path& directory) {
  if (directory.empty())
    throw checkpoint_error(
        "accel::save_state: the directory is an empty path; pass the checkpoint's directory, "
        "such as \"checkpoints/step_100\"");
  auto target = std::filesystem::absolute(directory).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();
  if (std::filesystem::is_symlink(target)) target = std::filesystem::canonical(target);
  const auto below = std::filesystem::current_path().lexically_relative(target);
  if (below.empty() || *below.begin() != "..")
    throw checkpoint_error("accel::save_state: " + directory.string() +
                           " is the working directory or one above it; give the checkpoint a directory of its own, "
                           "such as " +
                           (directory / "checkpoint").string());
  if (std::filesystem::exists(target) && !std::filesystem::is_directory(target))
    throw checkpoint_error("accel::save_state: " + directory.string() +
                           " is a file, not a directory; nothing was written: give save_state a directory");
  return target;
}

std::set<std::string> files_of_checkpoint(const std::filesystem::path& directory) {
  std::set<std::string> names;
  std::optional<checkpoint_manifest> manifest;
  try {
    manifest = read_manifest(directory);
  } catch (const checkpoint_error&) {  // a damaged manifest vouches for nothing
    return names;
  }
  if (manifest) {
    for (const auto& [name, file] : manifest->files()) names.insert(name);
    names.insert(std::string(checkpoint_files::manifest));
  } else if (std::filesystem::is_regular_file(directory / checkpoint_files::accel_state)) {
    for (const auto& entry : directory_entries(directory))
      if (is_checkpoint_file(entry.path().filename().string())) names.insert(entry.path().filename().string());
  }
  return names;
}

std::vector<std::string> remove_checkpoint_files(const std::filesystem::path& directory) {
  auto listed = files_of_checkpoint(directory);
  const bool has_manifest = listed.erase(std::string(checkpoint_files::manifest)) > 0;
  auto kept = remove_accels_files(directory, [&listed](const std::string& name) { return listed.contains(name); });
  if (!has_manifest) return kept;
  std::filesystem::remove(directory / checkpoint_files::manifest);
  std::erase(kept, std::string(checkpoint_files::manifest));
  if (kept.empty()) std::filesystem::remove(directory);
  return kept;
}

staging_directory::staging_directory(const std::filesystem::path& target)
    : target_(target), path_(target.string() + ".partial") {
  for (int attempt = 0; attempt < 3 && fd_ < 0; ++attempt) lock();
  if (fd_ < 0) throw busy();
  // The staging directory is accel's own: what carries accel's names there was written by a save.
  if (std::filesystem::is_directory(target_)) move_other_entries(path_, target_, staged);
  for (const auto& entry : directory_entries(path_))
    if (staged(entry.path().filename().string()) && entry.is_regular_file() && !entry.is_symlink())
      std::filesystem::remove(entry.path());
  if (!directory_entries(path_).empty())
    throw checkpoint_error("accel::save_state: " + path_.string() + " holds entries accel did not write (left by " +
                           "a save that crashed); move them away and save again");
}

void staging_directory::discard() noexcept {
  std::error_code ignored;
  if (std::filesystem::is_directory(path_, ignored)) try {
      remove_accels_files(path_, staged);
    } catch (...) {
    }
}

void staging_directory::install() {
  sync_directory<checkpoint_error>(path_);
  if (!std::filesystem::exists(target_)) {
    std::filesystem::rename(path_, target_);
    return sync_directory<checkpoint_error>(target_.parent_path());
  }
  carry_files_and_links();
#if defined(__linux__) && defined(RENAME_EXCHANGE)
  if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    sync_directory<checkpoint_error>(target_.parent_path());
    return retire(path_);  // now the old checkpoint
  }
#endif
  const auto old = std::filesystem::path(target_.string() + ".old");
  std::filesystem::rename(target_, old);
  std::filesystem::rename(path_, target_);
  sync_directory<checkpoint_error>(target_.parent_path());
  retire(old);
}

staging_busy staging_directory::busy() const {
  return staging_busy("accel::save_state: another process is saving into " + target_.string() + " (it holds " +
                      path_.string() + "); two jobs must not save into one directory: give each its own");
}

void staging_directory::retire(const std::filesystem::path& old) const {
  if_unlocked(old, [&] {
    const auto listed = files_of_checkpoint(old);
    const auto accels = [&listed](const std::string& name) { return listed.contains(name); };
    move_other_entries(old, target_, accels);
    remove_accels_files(old, accels);
  });
}

void staging_directory::lock() {
  if (::mkdir(path_.c_str(), 0777) != 0 && errno != EEXIST)
    throw checkpoint_error("accel::save_state: cannot create " + path_.string() + ": " + std::strerror(errno));
  const int fd = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    throw busy();
  }
  struct stat locked{}, named{};
  if (::fstat(fd, &locked) == 0 && ::stat(path_.c_str(), &named) == 0 && locked.st_ino == named.st_ino &&
      locked.st_dev == named.st_dev)
    fd_ = fd;
  else
    ::close(fd);  // another save renamed or removed it between our open and our lock
}

void staging_directory::carry_files_and_links() const {
  const auto listed = files_of_checkpoint(target_);
  for (const auto& entry : directory_entries(target_)) {
    const auto name = entry.path().filename();
    if (listed.contains(name.string()) && entry.is_regular_file() && !entry.is_symlink()) continue;
    if (std::filesystem::exists(std::filesystem::symlink_status(path_ / name)))
      throw checkpoint_error("accel::save_state: " + entry.path().string() +
                             " is not a file of the checkpoint there (its manifest does not list it), and this "
                             "save writes a file of that name: move it away (or delete it) and save again; the "
                             "checkpoint there is left as it was");
    if (entry.is_symlink()) {
      std::filesystem::copy_symlink(entry.path(), path_ / name);
    } else if (entry.is_regular_file()) {
      std::error_code error;
      std::filesystem::create_hard_link(entry.path(), path_ / name, error);
      if (error) std::filesystem::copy_file(entry.path(), path_ / name);  // a file system without hard links
    }
  }
}

std::optional<std::int64_t> checkpoint_number(std::string_view name) {
  constexpr std::string_view prefix = "checkpoint_";
  if (!checkpoint_files::is_numbered(name, prefix)) return std::nullopt;
  std::int64_t number = 0;
  if (std::from_chars(name.data() + prefix.size(), name.data() + name.size(), number).ec != std::errc{})
    return std::nullopt;
  return number;
}

std::map<std::int64_t, std::filesystem::path> numbered_checkpoints(const std::filesystem::path& root) {
  std::map<std::int64_t, std::filesystem::path> found;
  if (!std::filesystem::is_directory(root)) return found;
  for (const auto& entry : directory_entries(root))
    if (const auto number = checkpoint_number(entry.path().filename().string()); number && entry.is_directory())
      found[*number] = entry.path();
  return found;
}

}  // namespace accel::detail
