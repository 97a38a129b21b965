/// \file
/// What mlflow.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../mlflow.hpp"

namespace accel::detail {

std::string python_float_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char text[64];
  const auto magnitude = std::fabs(value);
  if (magnitude != 0 && (magnitude < 1e-4 || magnitude >= 1e16))
    return std::string(text, std::to_chars(text, text + sizeof text, value, std::chars_format::scientific).ptr);
  std::string fixed(text, std::to_chars(text, text + sizeof text, value, std::chars_format::fixed).ptr);
  return fixed.find('.') == std::string::npos ? fixed + ".0" : fixed;
}

std::string proto_double(double value) {
  if (std::isnan(value)) return "\"NaN\"";
  if (std::isinf(value)) return value < 0 ? "\"-Infinity\"" : "\"Infinity\"";
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, value).ptr);
}

std::string mlflow_key_values(const mlflow_pairs& pairs) {
  std::string json = "[";
  for (const auto& [key, value] : pairs)
    json += (json.size() > 1 ? ", " : "") + std::string("{\"key\": ") + json_string(key) +
            ", \"value\": " + json_string(value) + "}";
  return json + "]";
}

std::string mlflow_log_batch_fields(const std::vector<mlflow_metric>& metrics, const mlflow_pairs& params,
                                    const mlflow_pairs& tags) {
  std::string json = "\"metrics\": [";
  for (std::size_t i = 0; i < metrics.size(); ++i)
    json += (i == 0 ? "" : ", ") + std::string("{\"key\": ") + json_string(metrics[i].key) +
            ", \"value\": " + proto_double(metrics[i].value) +
            ", \"timestamp\": " + std::to_string(metrics[i].timestamp_ms) +
            ", \"step\": " + std::to_string(metrics[i].step) + "}";
  return json + "], \"params\": " + mlflow_key_values(params) + ", \"tags\": " + mlflow_key_values(tags);
}

std::string mlflow_update_fields(std::string_view status, std::int64_t end_time_ms) {
  std::string json = "\"status\": " + json_string(status);
  if (status != "RUNNING") json += ", \"end_time\": " + std::to_string(end_time_ms);
  return json;
}

std::string mlflow_create_run_body(std::string_view experiment_id, std::string_view run_name,
                                   std::int64_t start_time_ms, const mlflow_pairs& tags) {
  std::string json = "{\"experiment_id\": " + json_string(experiment_id) +
                     ", \"start_time\": " + std::to_string(start_time_ms) + ", \"tags\": " + mlflow_key_values(tags);
  if (!run_name.empty()) json += ", \"run_name\": " + json_string(run_name);
  return json + "}";
}

std::string read_json_string(std::string_view& text) {
  std::string out;
  for (std::size_t i = 1; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      text.remove_prefix(i + 1);
      return out;
    }
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i >= text.size()) break;
    const char e = text[i];
    if (e == 'u' && i + 4 < text.size()) {
      unsigned code = 0;
      std::from_chars(text.data() + i + 1, text.data() + i + 5, code, 16);
      i += 4;
      append_utf8(out, code);
    } else {
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b' : e == 'f' ? '\f' : e;
    }
  }
  throw http_error("an unterminated JSON string");
}

std::optional<std::string> json_string_field(std::string_view json, std::string_view key) {
  const auto quoted = json_string(key);
  for (auto at = json.find(quoted); at != std::string_view::npos; at = json.find(quoted, at + 1)) {
    auto rest = json.substr(at + quoted.size());
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\n' || rest.front() == '\t'))
      rest.remove_prefix(1);
    if (rest.empty() || rest.front() != ':') continue;
    rest.remove_prefix(1);
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\n' || rest.front() == '\t'))
      rest.remove_prefix(1);
    if (!rest.empty() && rest.front() == '"') return read_json_string(rest);
  }
  return std::nullopt;
}

mlflow_pairs parse_flat_json_object(std::string_view text, std::string_view what) {
  const auto fail = [&](std::string_view why) {
    return std::invalid_argument("accel: " + std::string(what) + " is not a flat JSON object of strings and numbers (" +
                                 std::string(why) + "); write it as {\"team\": \"vision\", \"trial\": 3}");
  };
  const auto skip_space = [&] { text.remove_prefix(std::min(text.find_first_not_of(" \t\r\n"), text.size())); };
  mlflow_pairs pairs;
  skip_space();
  if (text.empty() || text.front() != '{') throw fail("no opening brace");
  text.remove_prefix(1);
  for (skip_space(); !text.empty() && text.front() != '}'; skip_space()) {
    if (text.front() != '"') throw fail("a key is not a string");
    auto key = read_json_string(text);
    skip_space();
    if (text.empty() || text.front() != ':') throw fail("no colon after a key");
    text.remove_prefix(1);
    skip_space();
    if (text.empty() || text.front() == '{' || text.front() == '[') throw fail("a value is not a string or a number");
    std::string value;
    if (text.front() == '"') {
      value = read_json_string(text);
    } else {
      const auto end = std::min(text.find_first_of(",} \t\r\n"), text.size());
      value = std::string(text.substr(0, end));
      value = value == "true" ? "True" : value == "false" ? "False" : value == "null" ? "None" : value;
      text.remove_prefix(end);
    }
    pairs.emplace_back(std::move(key), std::move(value));
    skip_space();
    if (!text.empty() && text.front() == ',') text.remove_prefix(1);
  }
  if (text.empty()) throw fail("no closing brace");
  return pairs;
}

bool parse_python_bool(std::string text, std::string_view what) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (text == "y" || text == "yes" || text == "t" || text == "true" || text == "on" || text == "1") return true;
  if (text == "n" || text == "no" || text == "f" || text == "false" || text == "off" || text == "0") return false;
  throw std::invalid_argument("accel: " + std::string(what) + " is \"" + text + "\"; write true or false (or 1, 0)");
}

std::int64_t parse_whole_number(std::string_view text, std::string_view what, std::int64_t low, std::int64_t high) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < low || value > high)
    throw std::invalid_argument("accel: " + std::string(what) + " is \"" + std::string(text) +
                                "\"; give a whole number from " + std::to_string(low) + " to " + std::to_string(high));
  return value;
}

std::int64_t unix_millis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace accel::detail
