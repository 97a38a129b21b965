/// \file
/// The pieces of `accel::mlflow_tracker` that need no tensor: MLflow's limits, the text of parameters as Python's
/// `str` writes them (what Accelerate's MLflowTracker stores), the REST API's JSON bodies, the few fields read from
/// its answers, and the settings read from MLflow's environment variables.
// IWYU pragma: private, include <accel/tracking.hpp>
#pragma once

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../support/json.hpp"
#include "http.hpp"

namespace accel::detail {

/// MLflow's own limits (mlflow/utils/validation.py), which its server enforces.
inline constexpr std::size_t mlflow_max_param_length = 6000;
inline constexpr std::size_t mlflow_max_params_per_batch = 100;
inline constexpr std::size_t mlflow_max_metrics_per_batch = 1000;

/// A double as Python's `repr` (and `str`) writes it: the shortest text that reads back as the same value, in fixed
/// notation with a ".0" for integral values when 1e-4 <= |value| < 1e16, else in exponent notation ("1e-05").
inline std::string python_float_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char text[64];
  const auto magnitude = std::fabs(value);
  if (magnitude != 0 && (magnitude < 1e-4 || magnitude >= 1e16))
    return std::string(text, std::to_chars(text, text + sizeof text, value, std::chars_format::scientific).ptr);
  std::string fixed(text, std::to_chars(text, text + sizeof text, value, std::chars_format::fixed).ptr);
  return fixed.find('.') == std::string::npos ? fixed + ".0" : fixed;
}

/// A JSON number as protobuf's JSON mapping (MLflow's REST API) reads a double: non-finite values as strings.
inline std::string proto_double(double value) {
  if (std::isnan(value)) return "\"NaN\"";
  if (std::isinf(value)) return value < 0 ? "\"-Infinity\"" : "\"Infinity\"";
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, value).ptr);
}

/// One metric point of a `runs/log-batch` request.
struct mlflow_metric {
  std::string key;
  double value = 0;
  std::int64_t timestamp_ms = 0;
  std::int64_t step = 0;
};
using mlflow_pairs = std::vector<std::pair<std::string, std::string>>;

/// `[{"key": k, "value": v}, ...]`, MLflow's shape for params and tags.
inline std::string mlflow_key_values(const mlflow_pairs& pairs) {
  std::string json = "[";
  for (const auto& [key, value] : pairs)
    json += (json.size() > 1 ? ", " : "") + std::string("{\"key\": ") + json_string(key) +
            ", \"value\": " + json_string(value) + "}";
  return json + "]";
}

/// The body of `runs/log-batch` after its `run_id` (see `mlflow_run_body`).
inline std::string mlflow_log_batch_fields(const std::vector<mlflow_metric>& metrics, const mlflow_pairs& params,
                                           const mlflow_pairs& tags) {
  std::string json = "\"metrics\": [";
  for (std::size_t i = 0; i < metrics.size(); ++i)
    json += (i == 0 ? "" : ", ") + std::string("{\"key\": ") + json_string(metrics[i].key) +
            ", \"value\": " + proto_double(metrics[i].value) +
            ", \"timestamp\": " + std::to_string(metrics[i].timestamp_ms) +
            ", \"step\": " + std::to_string(metrics[i].step) + "}";
  return json + "], \"params\": " + mlflow_key_values(params) + ", \"tags\": " + mlflow_key_values(tags);
}

/// The body of `runs/update` after its `run_id`: the run's status ("RUNNING", "FINISHED") and, unless running,
/// its end time.
inline std::string mlflow_update_fields(std::string_view status, std::int64_t end_time_ms) {
  std::string json = "\"status\": " + json_string(status);
  if (status != "RUNNING") json += ", \"end_time\": " + std::to_string(end_time_ms);
  return json;
}

/// A request about a run whose id is known only once the run exists: `{"run_id": "...", fields}`.
inline std::string mlflow_run_body(std::string_view run_id, std::string_view fields) {
  return "{\"run_id\": " + json_string(run_id) + ", " + std::string(fields) + "}";
}

/// The body of `runs/create`.
inline std::string mlflow_create_run_body(std::string_view experiment_id, std::string_view run_name,
                                          std::int64_t start_time_ms, const mlflow_pairs& tags) {
  std::string json = "{\"experiment_id\": " + json_string(experiment_id) +
                     ", \"start_time\": " + std::to_string(start_time_ms) + ", \"tags\": " + mlflow_key_values(tags);
  if (!run_name.empty()) json += ", \"run_name\": " + json_string(run_name);
  return json + "}";
}

/// A JSON string literal's text at `text[0] == '"'`, unescaped (\uXXXX of the Basic Multilingual Plane as UTF-8);
/// `text` is left after the literal. Throws `http_error` when malformed.
inline std::string read_json_string(std::string_view& text) {
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

/// The first string value of `"key"` in a JSON document (MLflow's answers: `experiment_id`, `run_id`), or nullopt.
inline std::optional<std::string> json_string_field(std::string_view json, std::string_view key) {
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

/// A flat JSON object of strings, numbers and bools (MLFLOW_TAGS, as Accelerate's `json.loads` of it), as
/// key/text pairs: numbers as written, bools as Python's `str` ("True"). Throws `std::invalid_argument` naming `what`.
inline mlflow_pairs parse_flat_json_object(std::string_view text, std::string_view what) {
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

/// Python's `str_to_bool` (Accelerate's reading of MLFLOW_NESTED_RUN): y/yes/t/true/on/1 or n/no/f/false/off/0.
inline bool parse_python_bool(std::string text, std::string_view what) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (text == "y" || text == "yes" || text == "t" || text == "true" || text == "on" || text == "1") return true;
  if (text == "n" || text == "no" || text == "f" || text == "false" || text == "off" || text == "0") return false;
  throw std::invalid_argument("accel: " + std::string(what) + " is \"" + text + "\"; write true or false (or 1, 0)");
}

/// Milliseconds since the Unix epoch, MLflow's timestamps.
inline std::int64_t unix_millis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace accel::detail
