/// \file
/// The directory a checkpoint lives in, and what `save_state` may do to it. A save writes its files into a staging
/// directory beside the checkpoint (`DIR.partial`), locked while it is written, then exchanges it with `DIR` in one
/// atomic rename, so that a reader or a crash sees the old checkpoint or the new one, never a mix. What accel did
/// not write is never deleted: the user's files in `DIR` are linked into the new checkpoint before the exchange,
/// their directories moved into it right after, and a symbolic link at `DIR` is kept (its target is replaced).
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc, _GNU_SOURCE, which g++ defines)
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "../../checkpoint_error.hpp"
#include "../support/atomic_file.hpp"
#include "../support/directory_entries.hpp"
#include "format.hpp"
#include "manifest.hpp"

namespace accel::detail {

/// `staging_directory`'s refusal when another save holds the directory's lock.
struct staging_busy : checkpoint_error {
  using checkpoint_error::checkpoint_error;
};

/// What a save may remove from a checkpoint directory: only names save_state writes (format.hpp).
using checkpoint_files::is_checkpoint_file;

/// The directory `save_state(directory)` writes: `directory` made absolute and normal, without a trailing
/// separator (`"ckpt/"` is `ckpt`), a symbolic link followed to its target. An empty path, a file, and the
/// working directory or one above it are refused before anything is written.
inline std::filesystem::path checkpoint_directory(const std::filesystem::path& directory) {
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

/// The files of `directory` that a save of accel wrote: those its manifest lists, and the manifest itself. Without a
/// manifest, a checkpoint of accel 0.1 (which wrote none) is told by its `accel_state.bin`, and its files by their
/// names; any other directory holds none of accel's. Only these are ever removed from a checkpoint, so that a file of
/// the user's that carries one of accel's names (a `pytorch_model.bin` exported with `acc.save`) is never taken for
/// accel's.
inline std::set<std::string> files_of_checkpoint(const std::filesystem::path& directory) {
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

/// Removes the regular files among `directory`'s entries that `accels(name)` says are accel's, then the directory
/// if that left it empty. Returns what it left.
template <class IsAccels>
std::vector<std::string> remove_accels_files(const std::filesystem::path& directory, IsAccels&& accels) {
  std::vector<std::string> kept;
  for (const auto& entry : directory_entries(directory)) {
    const auto name = entry.path().filename().string();
    if (accels(name) && entry.is_regular_file() && !entry.is_symlink())
      std::filesystem::remove(entry.path());
    else
      kept.push_back(name);
  }
  if (kept.empty()) std::filesystem::remove(directory);
  return kept;
}
/// Removes a checkpoint's own files (`files_of_checkpoint`) from `directory`, its manifest last (a removal cut short
/// leaves the manifest that names what is left, for the next one to finish), then the directory if that left it
/// empty: pruning beyond total_limit, the old checkpoint after an install. Returns what it left.
inline std::vector<std::string> remove_checkpoint_files(const std::filesystem::path& directory) {
  auto listed = files_of_checkpoint(directory);
  const bool has_manifest = listed.erase(std::string(checkpoint_files::manifest)) > 0;
  auto kept = remove_accels_files(directory, [&listed](const std::string& name) { return listed.contains(name); });
  if (!has_manifest) return kept;
  std::filesystem::remove(directory / checkpoint_files::manifest);
  std::erase(kept, std::string(checkpoint_files::manifest));
  if (kept.empty()) std::filesystem::remove(directory);
  return kept;
}

/// Moves what is not accel's (`accels(name)`) from `from` into `to`, unless `to` holds that name; an entry `to` holds
/// as the same file (a hard link made by `install`) or as the same symbolic link (a copy `install` made) is only
/// removed from `from`.
template <class IsAccels>
void move_other_entries(const std::filesystem::path& from, const std::filesystem::path& to, IsAccels&& accels) {
  for (const auto& entry : directory_entries(from)) {
    const auto name = entry.path().filename();
    const bool link = entry.is_symlink(), regular = !link && entry.is_regular_file();
    if (regular && accels(name.string())) continue;
    const auto there = to / name;
    std::error_code error;
    if (!std::filesystem::exists(std::filesystem::symlink_status(there)))
      std::filesystem::rename(entry.path(), there);
    else if ((regular && std::filesystem::equivalent(entry.path(), there, error)) ||
             (link && std::filesystem::is_symlink(there) &&
              std::filesystem::read_symlink(entry.path()) == std::filesystem::read_symlink(there)))
      std::filesystem::remove(entry.path());
  }
}

/// Runs `action` while holding `directory`'s lock, unless another save holds it (then that save tidies it).
template <class Action>
void if_unlocked(const std::filesystem::path& directory, Action&& action) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) try {
      std::forward<Action>(action)();
    } catch (...) {
      ::close(fd);
      throw;
    }
  ::close(fd);
}

/// The staging directory `DIR.partial` of one save, locked (`flock`) for as long as this object lives, so that a
/// second process saving into the same directory is refused instead of mixing its files with this one's. Stale
/// staging directories (a save that crashed) are emptied of accel's files; anything else in one (the user's
/// entries of a save that crashed while moving them back) goes back into `DIR`.
class staging_directory {
 public:
  explicit staging_directory(const std::filesystem::path& target)
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
  staging_directory(const staging_directory&) = delete;
  staging_directory& operator=(const staging_directory&) = delete;
  ~staging_directory() {
    if (fd_ >= 0) ::close(fd_);
  }

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  /// Removes the staging directory after a failed save (accel's files only).
  void discard() noexcept {
    std::error_code ignored;
    if (std::filesystem::is_directory(path_, ignored)) try {
        remove_accels_files(path_, staged);
      } catch (...) {
      }
  }

  /// Puts the complete checkpoint in place of the target: the user's files and links in the target are linked into
  /// it, the two directories exchanged (Linux `renameat2`), the user's directories moved across, the old
  /// checkpoint's files removed. Without an exchange, two renames through `DIR.old`.
  void install() {
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

 private:
  staging_busy busy() const {
    return staging_busy("accel::save_state: another process is saving into " + target_.string() + " (it holds " +
                        path_.string() + "); two jobs must not save into one directory: give each its own");
  }

  // The old checkpoint: what the user added to it since carry_files_and_links goes to the new one, then accel's
  // files and the directory go. Locked first: a save that started meanwhile may have taken it as its staging
  // directory, and then it is that save's to tidy.
  void retire(const std::filesystem::path& old) const {
    if_unlocked(old, [&] {
      const auto listed = files_of_checkpoint(old);
      const auto accels = [&listed](const std::string& name) { return listed.contains(name); };
      move_other_entries(old, target_, accels);
      remove_accels_files(old, accels);
    });
  }
  /// A name accel writes in a staging directory (a file of the save, or its temporary).
  static bool staged(const std::string& name) { return is_checkpoint_file(name); }

  // Creates and locks the staging directory; leaves fd_ < 0 if it changed under us (then the caller tries again).
  void lock() {
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

  // Hard links of the user's files (the same file: an open log keeps growing in the new checkpoint) and copies of
  // their symbolic links: everything but what the old checkpoint's manifest lists. A file of the user's that this
  // save would write over (one of accel's names that no manifest vouched for) refuses the save: nothing is lost.
  void carry_files_and_links() const {
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

  std::filesystem::path target_, path_;
  int fd_ = -1;
};

/// The i of a `checkpoint_{i}` name; none for a name that is not `save_state()`'s: anything but decimal digits after
/// the prefix, or a number beyond int64.
inline std::optional<std::int64_t> checkpoint_number(std::string_view name) {
  constexpr std::string_view prefix = "checkpoint_";
  if (!checkpoint_files::is_numbered(name, prefix)) return std::nullopt;
  std::int64_t number = 0;
  if (std::from_chars(name.data() + prefix.size(), name.data() + name.size(), number).ec != std::errc{})
    return std::nullopt;
  return number;
}

/// The `checkpoint_{i}` directories under `root`, by i (`checkpoint_number`; other names are left out).
inline std::map<std::int64_t, std::filesystem::path> numbered_checkpoints(const std::filesystem::path& root) {
  std::map<std::int64_t, std::filesystem::path> found;
  if (!std::filesystem::is_directory(root)) return found;
  for (const auto& entry : directory_entries(root))
    if (const auto number = checkpoint_number(entry.path().filename().string()); number && entry.is_directory())
      found[*number] = entry.path();
  return found;
}

}  // namespace accel::detail
