// Command-line options as the subcommands spell them: `--name value` or `--name=value`, dashes or underscores.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "command.hpp"

namespace accel::cli {

// One option as the user spelled it (`--nproc-per-node=2`) and the name it stands for (`nproc_per_node`).
struct option_token {
  std::string spelling;              // what the user wrote before any '=', for messages
  std::string name;                  // dashes replaced by underscores
  std::optional<std::string> value;  // the part after '=', if any
};

option_token split_option(const std::string& argument);

// The option's value: after '=', or the next argument (`next`, consumed: `used_next` set) unless that is another
// option. Throws usage_error when there is none.
std::string option_value(const option_token& option, const std::string* next, bool& used_next);

// A whole number from low to high; otherwise usage_error naming the option and what it means.
long long parse_whole_number(const option_token& option, const std::string& text, long long low, long long high,
                             std::string_view meaning);

}  // namespace accel::cli
