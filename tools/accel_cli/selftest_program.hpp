// Where `accel env` and `accel test` find accel-selftest: the companion program built with LibTorch and accel's
// headers (tools/accel_selftest.cpp), so that the `accel` tool itself needs no LibTorch.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace accel::cli {

// Next to the running `accel` (a build tree), or in ../libexec/accel/ from it (an installation).
std::optional<std::filesystem::path> selftest_program();

// Says where accel-selftest was looked for and how to get it.
std::string selftest_missing_message();

}  // namespace accel::cli
