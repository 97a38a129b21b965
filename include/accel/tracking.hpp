/// \file
/// Experiment trackers (Accelerate's `init_trackers` / `log` / `end_training`): metrics logged during training go
/// to every active tracker, on the main process only.
///
/// Built-in trackers (`options::log_with`), each writing into the run directory
/// `{project.logging_dir or project.project_dir}/{project_name}/`, beside the run's `config.json`:
///   - `tracker::csv`          `metrics.csv`, one row per metric: `wall_time,step,name,value`. Robust when the
///                             metrics logged change from one call to the next; loads in any spreadsheet or pandas.
///   - `tracker::json_lines`   `metrics.jsonl`, one JSON object per `log` call: `{"step": 3, "wall_time": ...,
///                             "loss": 0.5}`. Non-finite values as Python's json writes them (NaN, Infinity).
///   - `tracker::tensorboard`  `events.out.tfevents.{unix seconds}.{hostname}.{pid}.{n}`, for `tensorboard --logdir`.
///   - `tracker::mlflow`       a run on the MLflow tracking server at `MLFLOW_TRACKING_URI` (http:// only), in the
///                             experiment named by the project (or `MLFLOW_EXPERIMENT_NAME`); see `mlflow_tracker`.
/// Each file is appended to (a resumed run continues it) and flushed after every `log` call, so that a crash loses
/// nothing already logged. Anything else (a database, a web service) derives from `accel::general_tracker` and is
/// passed to `init_trackers`.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "detail/config.hpp"
#include "detail/support/json.hpp"
#include "detail/tracking/mlflow.hpp"
#include "detail/tracking/mlflow_sender.hpp"
#include "detail/tracking/tensorboard.hpp"
#include "logging.hpp"
#include "options.hpp"

namespace accel {

/// The name a built-in tracker goes by (its `general_tracker::name()`).
constexpr std::string_view tracker_name(tracker kind) noexcept {
  switch (kind) {
    case tracker::csv:
      return "csv";
    case tracker::json_lines:
      return "json_lines";
    case tracker::tensorboard:
      return "tensorboard";
    case tracker::mlflow:
      return "mlflow";
  }
  return "unknown";
}

/// One value to log: `{"loss", 0.5}`, `{"epoch", 3}` or `{"loss", loss_tensor}` (a one-element tensor). A tensor is
/// read (`item()`, a device synchronisation) only when a tracker asks for `value()`, which happens on the main
/// process only: the other processes never wait for it.
class metric {
 public:
  template <class Number>
    requires std::is_arithmetic_v<Number>
  metric(std::string metric_name, Number number) : name(std::move(metric_name)), value_(static_cast<double>(number)) {}
  ACCEL_DECL metric(std::string metric_name, at::Tensor tensor);

  /// The value as a double (read from the tensor on the first call).
  [[nodiscard]] ACCEL_DECL double value() const;

  std::string name;

 private:
  ACCEL_DECL void check_one_element(const at::Tensor& tensor) const;
  std::variant<double, at::Tensor> value_;
  mutable std::optional<double> read_;
};

/// One entry of the run's configuration (Accelerate's `config` dict): a number, a bool or a string under a name,
/// e.g. `{"lr", 0.01}`, `{"batch_size", 32}`, `{"optimizer", "adamw"}`.
struct hyperparameter {
  using value_type = std::variant<bool, std::int64_t, double, std::string>;

  template <class Value>
    requires std::is_arithmetic_v<std::remove_cvref_t<Value>> || std::convertible_to<Value, std::string_view>
  hyperparameter(std::string entry_name, Value&& entry_value)
      : name(std::move(entry_name)), value(to_value(std::forward<Value>(entry_value))) {}

  std::string name;
  value_type value;

 private:
  template <class Value>
  static value_type to_value(Value&& given) {
    using type = std::remove_cvref_t<Value>;
    if constexpr (std::is_same_v<type, bool>)
      return given;
    else if constexpr (std::is_integral_v<type>)
      return static_cast<std::int64_t>(given);
    else if constexpr (std::is_floating_point_v<type>)
      return static_cast<double>(given);
    else
      return std::string(std::string_view(given));
  }
};
/// The run's configuration, in the order given (as Python's dict keeps it).
using hyperparameters = std::vector<hyperparameter>;

/// An experiment tracker (Accelerate's `GeneralTracker`): derive from it to send metrics anywhere, and pass it to
/// `accelerator::init_trackers`. Trackers live on the main process only; the accelerator calls
/// `store_init_configuration` once from `init_trackers`, `log` from each `accelerator::log`, and `finish` once from
/// `end_training` (or the accelerator's destructor).
class general_tracker {
 public:
  virtual ~general_tracker() = default;
  /// How `accelerator::get_tracker` finds it.
  [[nodiscard]] virtual std::string name() const = 0;
  virtual void store_init_configuration(const hyperparameters& config) { (void)config; }
  virtual void log(const std::vector<metric>& metrics, std::int64_t step) = 0;
  /// Flushes and closes whatever the tracker holds open.
  virtual void finish() {}
};

namespace detail {

/// Seconds since the Unix epoch, as each format stores its wall time.
ACCEL_DECL double wall_time();

/// The shortest decimal text that reads back as the same double ("0.1", "3", "1e-05"); non-finite values as the
/// format spells them.
ACCEL_DECL std::string number_text(double value, std::string_view nan, std::string_view infinity);
/// JSON numbers as Python's json module writes (and reads) them.
inline std::string json_number(double value) { return number_text(value, "NaN", "Infinity"); }

ACCEL_DECL std::string json_value(const hyperparameter::value_type& value);

/// A CSV field, quoted when it holds a comma, a quote or a line break (RFC 4180: quotes doubled).
ACCEL_DECL std::string csv_field(std::string_view text);

/// A file of a run directory: every write goes to the OS at once (a crash loses nothing already written), and
/// every failure names the file and the OS error.
class run_file {
 public:
  enum mode { append, overwrite };
  ACCEL_DECL run_file(std::filesystem::path path, mode how);
  /// True when the file held nothing before this run (a header is due).
  [[nodiscard]] bool was_empty() const noexcept { return was_empty_; }
  ACCEL_DECL void write(std::string_view text);
  void close() {
    if (file_ && std::fclose(file_.release()) != 0) fail("cannot close");
  }

 private:
  [[noreturn]] ACCEL_DECL void fail(const std::string& what) const;
  struct closer {
    void operator()(std::FILE* file) const noexcept { std::fclose(file); }
  };
  std::filesystem::path path_;
  std::unique_ptr<std::FILE, closer> file_;
  bool was_empty_ = true;
};

}  // namespace detail

/// `metrics.csv`: a header `wall_time,step,name,value`, then one row per metric.
class csv_tracker final : public general_tracker {
 public:
  ACCEL_DECL explicit csv_tracker(const std::filesystem::path& run_directory);
  [[nodiscard]] std::string name() const override { return std::string(tracker_name(tracker::csv)); }
  ACCEL_DECL void log(const std::vector<metric>& metrics, std::int64_t step) override;
  void finish() override { file_.close(); }

 private:
  detail::run_file file_;
};

/// `metrics.jsonl`: one JSON object per `log` call, `{"step": 3, "wall_time": 1795000000.25, "loss": 0.5}`.
class json_lines_tracker final : public general_tracker {
 public:
  explicit json_lines_tracker(const std::filesystem::path& run_directory)
      : file_(run_directory / "metrics.jsonl", detail::run_file::append) {}
  [[nodiscard]] std::string name() const override { return std::string(tracker_name(tracker::json_lines)); }
  ACCEL_DECL void log(const std::vector<metric>& metrics, std::int64_t step) override;
  void finish() override { file_.close(); }

 private:
  detail::run_file file_;
};

/// `events.out.tfevents.{unix seconds}.{hostname}.{pid}.{n}`: one scalar event per metric, tagged with its name (as
/// PyTorch's `SummaryWriter.add_scalar`); values are stored as float, as TensorBoard's scalars are.
class tensorboard_tracker final : public general_tracker {
 public:
  explicit tensorboard_tracker(const std::filesystem::path& run_directory)
      : tensorboard_tracker(run_directory, detail::wall_time()) {}
  [[nodiscard]] std::string name() const override { return std::string(tracker_name(tracker::tensorboard)); }
  ACCEL_DECL void log(const std::vector<metric>& metrics, std::int64_t step) override;
  void finish() override { file_.close(); }
  /// The event file's path.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  ACCEL_DECL tensorboard_tracker(const std::filesystem::path& run_directory, double now);
  std::filesystem::path path_;
  detail::run_file file_;
};

/// Where and how `mlflow_tracker` logs. `from_environment` reads MLflow's variables as Accelerate's MLflowTracker
/// does (each over the value given in code).
struct mlflow_settings {
  /// The tracking server, `http://host:port` (MLFLOW_TRACKING_URI); https:// needs a local proxy (see
  /// docs/trackers.md).
  std::string tracking_uri;
  /// The experiment, created when missing (MLFLOW_EXPERIMENT_NAME; `init_trackers`' project name without it).
  std::string experiment_name;
  /// The new run's name (MLFLOW_RUN_NAME); empty: the server makes one up.
  std::string run_name;
  /// Log into this existing run instead of creating one, marking it running again (MLFLOW_RUN_ID).
  std::string run_id;
  /// Tags of the run (MLFLOW_TAGS, a JSON object: `{"team": "vision"}`).
  std::vector<std::pair<std::string, std::string>> tags;
  /// MLFLOW_NESTED_RUN, read as Accelerate reads it; a C++ process has no active parent run, so the run is a
  /// top-level one either way (as MLflow's `start_run(nested=True)` without an active run).
  bool nested_run = false;
  /// The run's description (the `mlflow.note.content` tag).
  std::string description;
  std::chrono::milliseconds connect_timeout{10000};
  /// From sending a request to the end of its answer (MLFLOW_HTTP_REQUEST_TIMEOUT, in seconds; MLflow's 120 s).
  std::chrono::milliseconds response_timeout = std::chrono::seconds(120);
  /// Once training has ended, a request the server does not take is given up after this many retries
  /// (MLFLOW_HTTP_REQUEST_MAX_RETRIES; MLflow's 7); while training runs, requests are retried as long as it does.
  int max_retries = 7;
  /// The longest `end_training` waits for queued requests, in all; none: as long as the server takes each within
  /// its retries.
  std::optional<std::chrono::milliseconds> finish_timeout{};
  /// Retries wait 0.1 s, doubling up to this.
  std::chrono::milliseconds max_backoff{2000};
  /// Requests waiting for the server at most; beyond it new metric batches are dropped (params and the final
  /// status are always kept).
  std::size_t queue_capacity = 10000;

  /// The settings with MLflow's environment variables read over `experiment` and `bounds` (the accelerator's
  /// `options::mlflow`): MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, MLFLOW_RUN_NAME, MLFLOW_RUN_ID, MLFLOW_TAGS,
  /// MLFLOW_NESTED_RUN, MLFLOW_HTTP_REQUEST_TIMEOUT and MLFLOW_HTTP_REQUEST_MAX_RETRIES.
  ACCEL_DECL static mlflow_settings from_environment(std::string experiment, const mlflow_options& bounds = {});
};

/// Accelerate's MLflowTracker: a run of an MLflow experiment on a tracking server, through MLflow's REST API.
/// `init_trackers`' configuration becomes the run's params (as Python's `str` writes the values; values longer than
/// MLflow's 6000 characters are dropped with a warning, as Accelerate drops them), each `log` call a batch of metrics
/// at its step, `end_training` ends the run (status FINISHED). The requests go out from a background thread: the
/// server being down, slow or failing never stops or slows training (see docs/trackers.md).
class mlflow_tracker final : public general_tracker {
 public:
  ACCEL_DECL explicit mlflow_tracker(const mlflow_settings& settings);
  ~mlflow_tracker() override { finish(); }
  [[nodiscard]] std::string name() const override { return std::string(tracker_name(tracker::mlflow)); }

  ACCEL_DECL void store_init_configuration(const hyperparameters& config) override;

  /// The params of `config` as Accelerate's MLflowTracker logs them: each value as `str(value)`, those longer than
  /// MLflow's limit left out (their names added to `dropped`).
  ACCEL_DECL static detail::mlflow_pairs params_of(const hyperparameters& config, std::vector<std::string>& dropped);

  /// Queues the metrics (a batch per 1000); returns at once.
  ACCEL_DECL void log(const std::vector<metric>& metrics, std::int64_t step) override;

  /// Ends the run (status FINISHED), waiting for the queued requests (each within its retries, all within
  /// `finish_timeout` when set); what was not sent is said in one warning.
  ACCEL_DECL void finish() override;

  /// The run's id once the server has created it; "" before (or when it never answered).
  [[nodiscard]] std::string run_id() const { return sender_.run_id(); }
  /// Metric batches dropped because the queue was full.
  [[nodiscard]] std::size_t dropped() const { return sender_.dropped(); }

  /// A param's text as Accelerate's `str(value)` makes it: True/False, 32, 0.001, 1e-05, text as is.
  ACCEL_DECL static std::string param_text(const hyperparameter::value_type& value);

 private:
  ACCEL_DECL void submit_metrics(std::vector<detail::mlflow_metric> batch);
  ACCEL_DECL static detail::mlflow_sender_config sender_config(const mlflow_settings& settings);

  std::mutex logging_;
  logger logger_;
  detail::mlflow_sender sender_;  // last: its thread may warn through logger_
};

namespace detail {

/// A tracker that ignores everything: what `get_tracker` gives processes other than the main one (as Accelerate's
/// blank GeneralTracker), so that code calling it needs no `if (is_main_process())`.
class blank_tracker final : public general_tracker {
 public:
  [[nodiscard]] std::string name() const override { return "blank"; }
  void log(const std::vector<metric>&, std::int64_t) override {}
};

/// The accelerator's trackers: created by `start` on the main process, fed by `log`, closed by `finish` (or the
/// destructor).
class tracker_set {
 public:
  ACCEL_DECL tracker_set(std::vector<tracker> log_with, const project_options& project,
                         const mlflow_options& mlflow = {});
  tracker_set(const tracker_set&) = delete;
  tracker_set& operator=(const tracker_set&) = delete;
  ACCEL_DECL ~tracker_set();
  /// `tracker_name`, for the accelerator's `get_tracker(tracker)`, which names this class only where it is complete.
  static constexpr std::string_view name_of(tracker kind) noexcept { return tracker_name(kind); }

  /// On the main process: the built-in trackers of `log_with` in the run directory (created, with the
  /// configuration as `config.json`; none without them), then `extra`; every tracker gets the configuration.
  /// Elsewhere it only records that tracking started.
  ACCEL_DECL void start(const std::string& project_name, const hyperparameters& config,
                        std::vector<std::shared_ptr<general_tracker>> extra, bool main_process);

  /// Sends `metrics` to every tracker at `step` (default: the number of earlier calls).
  ACCEL_DECL void log(const std::vector<metric>& metrics, std::optional<std::int64_t> step, bool main_process);

  /// A name twice in one call, or one of metrics.jsonl's own fields, would make keys that shadow each other.
  ACCEL_DECL static void check_names(const std::vector<metric>& metrics);

  /// Finishes every tracker, once. They stay alive with the accelerator, so that references from `get` never dangle.
  ACCEL_DECL void finish();

  ACCEL_DECL general_tracker& get(std::string_view name, bool main_process);

 private:
  ACCEL_DECL static void check(const std::string& project_name, const hyperparameters& config);
  [[nodiscard]] ACCEL_DECL std::filesystem::path make_run_directory(const std::string& project_name) const;
  [[nodiscard]] ACCEL_DECL std::shared_ptr<general_tracker> make(tracker kind, const std::filesystem::path& directory,
                                                                 const std::string& project_name) const;
  ACCEL_DECL static void write_config(const std::filesystem::path& file, const hyperparameters& config);

  std::vector<tracker> log_with_;
  mlflow_options mlflow_;
  std::filesystem::path root_;
  std::vector<std::shared_ptr<general_tracker>> active_;
  std::vector<std::shared_ptr<general_tracker>> finished_;
  bool started_ = false;
  std::int64_t log_calls_ = 0;
};

}  // namespace detail
}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/tracking.ipp"
#endif
