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

#include "../config.hpp"
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
ACCEL_DECL std::filesystem::path checkpoint_directory(const std::filesystem::path& directory);

/// The files of `directory` that a save of accel wrote: those its manifest lists, and the manifest itself. Without a
/// manifest, a checkpoint of accel 0.1 (which wrote none) is told by its `accel_state.bin`, and its files by their
/// names; any other directory holds none of accel's. Only these are ever removed from a checkpoint, so that a file of
/// the user's that carries one of accel's names (a `pytorch_model.bin` exported with `acc.save`) is never taken for
/// accel's.
ACCEL_DECL std::set<std::string> files_of_checkpoint(const std::filesystem::path& directory);

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
ACCEL_DECL std::vector<std::string> remove_checkpoint_files(const std::filesystem::path& directory);

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
  ACCEL_DECL explicit staging_directory(const std::filesystem::path& target);
  staging_directory(const staging_directory&) = delete;
  staging_directory& operator=(const staging_directory&) = delete;
  ~staging_directory() {
    if (fd_ >= 0) ::close(fd_);
  }

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  /// Removes the staging directory after a failed save (accel's files only).
  ACCEL_DECL void discard() noexcept;

  /// Puts the complete checkpoint in place of the target: the user's files and links in the target are linked into
  /// it, the two directories exchanged (Linux `renameat2`), the user's directories moved across, the old
  /// checkpoint's files removed. Without an exchange, two renames through `DIR.old`.
  ACCEL_DECL void install();

 private:
  ACCEL_DECL staging_busy busy() const;

  // The old checkpoint: what the user added to it since carry_files_and_links goes to the new one, then accel's
  // files and the directory go. Locked first: a save that started meanwhile may have taken it as its staging
  // directory, and then it is that save's to tidy.
  ACCEL_DECL void retire(const std::filesystem::path& old) const;
  /// A name accel writes in a staging directory (a file of the save, or its temporary).
  static bool staged(const std::string& name) { return is_checkpoint_file(name); }

  // Creates and locks the staging directory; leaves fd_ < 0 if it changed under us (then the caller tries again).
  ACCEL_DECL void lock();

  // Hard links of the user's files (the same file: an open log keeps growing in the new checkpoint) and copies of
  // their symbolic links: everything but what the old checkpoint's manifest lists. A file of the user's that this
  // save would write over (one of accel's names that no manifest vouched for) refuses the save: nothing is lost.
  ACCEL_DECL void carry_files_and_links() const;

  std::filesystem::path target_, path_;
  int fd_ = -1;
};

/// The i of a `checkpoint_{i}` name; none for a name that is not `save_state()`'s: anything but decimal digits after
/// the prefix, or a number beyond int64.
ACCEL_DECL std::optional<std::int64_t> checkpoint_number(std::string_view name);

/// The `checkpoint_{i}` directories under `root`, by i (`checkpoint_number`; other names are left out).
ACCEL_DECL std::map<std::int64_t, std::filesystem::path> numbered_checkpoints(const std::filesystem::path& root);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/directory.ipp"
#endif
