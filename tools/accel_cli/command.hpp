// What every `accel` subcommand shares: its entry point's shape, the usage-error exception and the exit codes.
// A new subcommand (env, test, config, ...) is one more file that defines a `command` and one line in main.cpp.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace accel::cli {

// Exit codes shared by the subcommands: 2 for a wrong command line, as most command-line tools do.
inline constexpr int exit_ok = 0;
inline constexpr int exit_usage = 2;

// A mistake on the command line. The message names the problem and the fix; main prints it with the subcommand's
// name and exits with exit_usage.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct command {
  std::string_view name;
  std::string_view summary;  // one line for `accel --help`
  std::string_view usage;    // the synopsis, repeated after a usage error
  // Runs the subcommand on the arguments after its name; returns the process exit code or throws usage_error.
  int (*run)(const std::vector<std::string>& args);
};

}  // namespace accel::cli
