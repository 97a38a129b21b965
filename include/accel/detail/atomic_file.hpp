/// \file
/// Writing a file so that readers see the old file or the whole new one, never a part: the content goes to a
/// temporary file beside it, renamed over it once complete (rename is atomic within a file system).
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace accel::detail {

/// Calls `write(out)` on a temporary file beside `path`, then renames it to `path`. Throws `Error` naming the file
/// when writing or renaming fails; the temporary file is removed then.
template <class Error, class Write>
void write_atomically(const std::filesystem::path& path, Write&& write) {
  const std::filesystem::path temporary = path.string() + ".tmp" + std::to_string(::getpid());
  std::error_code error;
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    write(out);
    out.flush();
    if (!out) {
      std::filesystem::remove(temporary, error);
      throw Error("accel: writing " + path.string() + " failed (disk full? no permission for the directory?)");
    }
  }
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    throw Error("accel: cannot write " + path.string() + ": " + error.message());
  }
}

}  // namespace accel::detail
