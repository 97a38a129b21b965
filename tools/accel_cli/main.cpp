// `accel`: the command-line tool of the accel library. main() only picks the subcommand; each subcommand lives in
// its own file and is listed in `commands` below.
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "command.hpp"
#include "config.hpp"
#include "env.hpp"
#include "estimate_memory.hpp"
#include "fr_trace.hpp"
#include "launch.hpp"
#include "merge_weights.hpp"
#include "test.hpp"

#ifndef ACCEL_VERSION_STRING
#error "ACCEL_VERSION_STRING must be defined by the build (tools/CMakeLists.txt sets it from the project version)"
#endif

namespace {

using accel::cli::command;

constexpr command commands[] = {
    accel::cli::launch_command,   accel::cli::config_command,        accel::cli::env_command,
    accel::cli::test_command,     accel::cli::merge_weights_command, accel::cli::estimate_memory_command,
    accel::cli::fr_trace_command,
};

const command* find_command(std::string_view name) {
  for (const command& c : commands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

void print_help(std::FILE* out) {
  std::fprintf(out,
               "usage: accel <command> [arguments]\n"
               "       accel --version\n"
               "\n"
               "commands:\n");
  for (const command& c : commands) {
    std::fprintf(out, "  %-13.*s %.*s\n", static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  }
  std::fprintf(out, "\nRun 'accel <command> --help' for a command's options.\n");
}

std::string command_names() {
  std::string names;
  for (const command& c : commands) {
    if (!names.empty()) names += ", ";
    names += c.name;
  }
  return names;
}

int unknown_command(const std::string& name) {
  std::fprintf(stderr, "accel: error: unknown command '%s'; the commands are: %s (see 'accel --help')\n", name.c_str(),
               command_names().c_str());
  return accel::cli::exit_usage;
}

int run_command(const command& c, std::vector<std::string> args) {
  try {
    return c.run(args);
  } catch (const accel::cli::usage_error& e) {
    std::fprintf(stderr, "accel %.*s: error: %s\nusage: %.*s\nRun 'accel %.*s --help' for the options.\n",
                 static_cast<int>(c.name.size()), c.name.data(), e.what(), static_cast<int>(c.usage.size()),
                 c.usage.data(), static_cast<int>(c.name.size()), c.name.data());
    return accel::cli::exit_usage;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::span<char*> argument_span(argv + 1, argv + argc);
  const std::vector<std::string> arguments(argument_span.begin(), argument_span.end());
  if (arguments.empty()) {
    std::fprintf(stderr, "accel: error: no command given\n\n");
    print_help(stderr);
    return accel::cli::exit_usage;
  }
  const std::string_view first = arguments.front();
  if (first == "--version" || first == "-V" || first == "version") {
    std::printf("accel %s\n", ACCEL_VERSION_STRING);
    return accel::cli::exit_ok;
  }
  if (first == "--help" || first == "-h" || first == "help") {
    // `accel help launch` is `accel launch --help`.
    if (arguments.size() > 1) {
      const command* c = find_command(arguments[1]);
      if (c == nullptr) return unknown_command(arguments[1]);
      return run_command(*c, {"--help"});
    }
    print_help(stdout);
    return accel::cli::exit_ok;
  }
  const command* c = find_command(first);
  if (c == nullptr) return unknown_command(arguments.front());
  try {
    return run_command(*c, {arguments.begin() + 1, arguments.end()});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel %s: error: %s\n", arguments.front().c_str(), e.what());
    return 1;
  }
}
