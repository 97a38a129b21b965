#include "arguments.hpp"

#include <charconv>

namespace accel::cli {

option_token split_option(const std::string& argument) {
  const std::size_t equals = argument.find('=');
  option_token token;
  token.spelling = argument.substr(0, equals);
  if (equals != std::string::npos) token.value = argument.substr(equals + 1);
  const std::size_t dashes = token.spelling.starts_with("--") ? 2 : 1;
  token.name = token.spelling.substr(dashes);
  for (char& c : token.name) {
    if (c == '-') c = '_';
  }
  return token;
}

std::string option_value(const option_token& option, const std::string* next, bool& used_next) {
  if (option.value) return *option.value;
  if (next != nullptr && !next->starts_with("--")) {
    used_next = true;
    return *next;
  }
  throw usage_error(option.spelling + " needs a value, e.g. " + option.spelling + " 2 or " + option.spelling + "=2");
}

long long parse_whole_number(const option_token& option, const std::string& text, long long low, long long high,
                             std::string_view meaning) {
  long long number = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, number);
  if (text.empty() || error != std::errc{} || stop != end || number < low || number > high) {
    throw usage_error(option.spelling + " must be a whole number from " + std::to_string(low) + " to " +
                      std::to_string(high) + " (" + std::string(meaning) + "), not '" + text + "'");
  }
  return number;
}

}  // namespace accel::cli
