#include "selftest_program.hpp"

#include <unistd.h>

#include <array>
#include <vector>
#include "accel/detail/support/text.hpp"

namespace accel::cli {
namespace {

constexpr const char* program_name = "accel-selftest";

std::filesystem::path own_directory() {
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::filesystem::path{} : self.parent_path();
}

std::vector<std::filesystem::path> candidates() {
  const auto directory = own_directory();
  if (directory.empty()) return {};
  return {directory / program_name, directory.parent_path() / "libexec" / "accel" / program_name};
}

}  // namespace

std::optional<std::filesystem::path> selftest_program() {
  for (const auto& candidate : candidates()) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

std::string selftest_missing_message() {
  std::string places;
  for (const auto& candidate : candidates()) accel::detail::append_item(places, candidate.string(), " or ");
  return std::string("accel-selftest (built with LibTorch beside the accel tool) is not at ") + places +
         "; build the accel_selftest target (or install accel) next to this accel";
}

}  // namespace accel::cli
