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

#include "../config.hpp"
#include "../support/json.hpp"
#include "http.hpp"

namespace accel::detail {

/// MLflow's own limits (mlflow/utils/validation.py), which its server enforces.
inline constexpr std::size_t mlflow_max_param_length = 6000;
inline constexpr std::size_t mlflow_max_params_per_batch = 100;
inline constexpr std::size_t mlflow_max_metrics_per_batch = 1000;

/// A double as Python's `repr` (and `str`) writes it: the shortest text that reads back as the same value, in fixed
/// notation with a ".0" for integral values when 1e-4 <= |value| < 1e16, else in exponent notation ("1e-05").
ACCEL_DECL std::string python_float_text(double value);

/// A JSON number as protobuf's JSON mapping (MLflow's REST API) reads a double: non-finite values as strings.
ACCEL_DECL std::string proto_double(double value);

/// One metric point of a `runs/log-batch` request.
struct mlflow_metric {
  std::string key;
  double value = 0;
  std::int64_t timestamp_ms = 0;
  std::int64_t step = 0;
};
using mlflow_pairs = std::vector<std::pair<std::string, std::string>>;

/// `[{"key": k, "value": v}, ...]`, MLflow's shape for params and tags.
ACCEL_DECL std::string mlflow_key_values(const mlflow_pairs& pairs);

/// The body of `runs/log-batch` after its `run_id` (see `mlflow_run_body`).
ACCEL_DECL std::string mlflow_log_batch_fields(const std::vector<mlflow_metric>& metrics, const mlflow_pairs& params,
                                               const mlflow_pairs& tags);

/// The body of `runs/update` after its `run_id`: the run's status ("RUNNING", "FINISHED") and, unless running,
/// its end time.
ACCEL_DECL std::string mlflow_update_fields(std::string_view status, std::int64_t end_time_ms);

/// A request about a run whose id is known only once the run exists: `{"run_id": "...", fields}`.
inline std::string mlflow_run_body(std::string_view run_id, std::string_view fields) {
  return "{\"run_id\": " + json_string(run_id) + ", " + std::string(fields) + "}";
}

/// The body of `runs/create`.
ACCEL_DECL std::string mlflow_create_run_body(std::string_view experiment_id, std::string_view run_name,
                                              std::int64_t start_time_ms, const mlflow_pairs& tags);

/// A JSON string literal's text at `text[0] == '"'`, unescaped (\uXXXX of the Basic Multilingual Plane as UTF-8);
/// `text` is left after the literal. Throws `http_error` when malformed.
ACCEL_DECL std::string read_json_string(std::string_view& text);

/// The first string value of `"key"` in a JSON document (MLflow's answers: `experiment_id`, `run_id`), or nullopt.
ACCEL_DECL std::optional<std::string> json_string_field(std::string_view json, std::string_view key);

/// A flat JSON object of strings, numbers and bools (MLFLOW_TAGS, as Accelerate's `json.loads` of it), as
/// key/text pairs: numbers as written, bools as Python's `str` ("True"). Throws `std::invalid_argument` naming `what`.
ACCEL_DECL mlflow_pairs parse_flat_json_object(std::string_view text, std::string_view what);

/// Python's `str_to_bool` (Accelerate's reading of MLFLOW_NESTED_RUN): y/yes/t/true/on/1 or n/no/f/false/off/0.
ACCEL_DECL bool parse_python_bool(std::string text, std::string_view what);

/// A whole number from `low` to `high` (MLflow's integer variables, as its `int(value)` reads them). Throws
/// `std::invalid_argument` naming `what` and the range.
ACCEL_DECL std::int64_t parse_whole_number(std::string_view text, std::string_view what, std::int64_t low,
                                           std::int64_t high);

/// Milliseconds since the Unix epoch, MLflow's timestamps.
ACCEL_DECL std::int64_t unix_millis();

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/mlflow.ipp"
#endif
