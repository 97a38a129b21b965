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
  metric(std::string metric_name, at::Tensor tensor) : name(std::move(metric_name)), value_(std::move(tensor)) {
    check_one_element(std::get<at::Tensor>(value_));
  }

  /// The value as a double (read from the tensor on the first call).
  [[nodiscard]] double value() const {
    if (const auto* number = std::get_if<double>(&value_)) return *number;
    if (!read_) read_ = std::get<at::Tensor>(value_).item<double>();
    return *read_;
  }

  std::string name;

 private:
  void check_one_element(const at::Tensor& tensor) const {
    if (!tensor.defined() || tensor.numel() != 1) {
      std::ostringstream shape;
      if (tensor.defined())
        shape << "has shape " << tensor.sizes();
      else
        shape << "is undefined";
      throw std::invalid_argument("accel::metric \"" + name + "\": a tensor metric holds one element; this one " +
                                  shape.str() + "; log a reduction of it (mean(), sum()) or its elements one by one");
    }
  }
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
inline double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// The shortest decimal text that reads back as the same double ("0.1", "3", "1e-05"); non-finite values as the
/// format spells them.
inline std::string number_text(double value, std::string_view nan, std::string_view infinity) {
  if (std::isnan(value)) return std::string(nan);
  if (std::isinf(value)) return (value < 0 ? "-" : "") + std::string(infinity);
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, value).ptr);
}
/// JSON numbers as Python's json module writes (and reads) them.
inline std::string json_number(double value) { return number_text(value, "NaN", "Infinity"); }

inline std::string json_value(const hyperparameter::value_type& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using type = std::remove_cvref_t<decltype(v)>;
        if constexpr (std::is_same_v<type, bool>)
          return v ? "true" : "false";
        else if constexpr (std::is_same_v<type, std::int64_t>)
          return std::to_string(v);
        else if constexpr (std::is_same_v<type, double>)
          return json_number(v);
        else
          return detail::json_string(v);
      },
      value);
}

/// A CSV field, quoted when it holds a comma, a quote or a line break (RFC 4180: quotes doubled).
inline std::string csv_field(std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(text);
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

/// A file of a run directory: every write goes to the OS at once (a crash loses nothing already written), and
/// every failure names the file and the OS error.
class run_file {
 public:
  enum mode { append, overwrite };
  run_file(std::filesystem::path path, mode how)
      : path_(std::move(path)), file_(std::fopen(path_.c_str(), how == append ? "ab" : "wb")) {
    if (!file_) fail("cannot open");
    std::fseek(file_.get(), 0, SEEK_END);  // where appending starts: 0 for a new file
    was_empty_ = std::ftell(file_.get()) == 0;
  }
  /// True when the file held nothing before this run (a header is due).
  [[nodiscard]] bool was_empty() const noexcept { return was_empty_; }
  void write(std::string_view text) {
    if (!file_)
      throw std::logic_error("accel: " + path_.string() +
                             " is closed (the tracker has finished); log before end_training()");
    if (std::fwrite(text.data(), 1, text.size(), file_.get()) != text.size() || std::fflush(file_.get()) != 0)
      fail("cannot write to");
  }
  void close() {
    if (file_ && std::fclose(file_.release()) != 0) fail("cannot close");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("accel: " + what + " " + path_.string() + ": " + std::strerror(errno) +
                             "; make options::project.logging_dir a writable directory with free space");
  }
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
  explicit csv_tracker(const std::filesystem::path& run_directory)
      : file_(run_directory / "metrics.csv", detail::run_file::append) {
    if (file_.was_empty()) file_.write("wall_time,step,name,value\n");
  }
  [[nodiscard]] std::string name() const override { return std::string(tracker_name(tracker::csv)); }
  void log(const std::vector<metric>& metrics, std::int64_t step) override {
    const auto prefix = detail::json_number(detail::wall_time()) + "," + std::to_string(step) + ",";
    std::string rows;
    for (const auto& m : metrics)
      rows += prefix + detail::csv_field(m.name) + "," + detail::number_text(m.value(), "nan", "inf") + "\n";
    file_.write(rows);
  }
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
  void log(const std::vector<metric>& metrics, std::int64_t step) override {
    std::string line =
        "{\"step\": " + std::to_string(step) + ", \"wall_time\": " + detail::json_number(detail::wall_time());
    for (const auto& m : metrics) line += ", " + detail::json_string(m.name) + ": " + detail::json_number(m.value());
    file_.write(line + "}\n");
  }
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
  void log(const std::vector<metric>& metrics, std::int64_t step) override {
    const auto now = detail::wall_time();
    std::string records;
    for (const auto& m : metrics)
      records += detail::tfrecord(detail::scalar_event(now, step, m.name, static_cast<float>(m.value())));
    file_.write(records);
  }
  void finish() override { file_.close(); }
  /// The event file's path.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  tensorboard_tracker(const std::filesystem::path& run_directory, double now)
      : path_(run_directory / detail::event_file_name(static_cast<std::int64_t>(now))),
        file_(path_, detail::run_file::append) {
    file_.write(detail::tfrecord(detail::file_version_event(now)));
  }
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
  std::chrono::milliseconds connect_timeout{2000};
  /// From sending a request to the end of its answer.
  std::chrono::milliseconds response_timeout{5000};
  /// The longest `end_training` waits for queued requests to reach the server.
  std::chrono::milliseconds finish_timeout{10000};
  /// Retries wait 0.1 s, doubling up to this.
  std::chrono::milliseconds max_backoff{2000};
  /// Requests waiting for the server at most; beyond it new metric batches are dropped (params and the final
  /// status are always kept).
  std::size_t queue_capacity = 10000;

  /// The settings with MLflow's environment variables read over `experiment`.
  static mlflow_settings from_environment(std::string experiment) {
    mlflow_settings settings;
    settings.experiment_name = std::move(experiment);
    const auto read = [](const char* name, std::string& into) {
      if (const char* value = std::getenv(name); value != nullptr && *value != '\0') into = value;
    };
    read("MLFLOW_TRACKING_URI", settings.tracking_uri);
    read("MLFLOW_EXPERIMENT_NAME", settings.experiment_name);
    read("MLFLOW_RUN_NAME", settings.run_name);
    read("MLFLOW_RUN_ID", settings.run_id);
    std::string text;
    read("MLFLOW_TAGS", text);
    if (!text.empty()) settings.tags = detail::parse_flat_json_object(text, "MLFLOW_TAGS");
    text.clear();
    read("MLFLOW_NESTED_RUN", text);
    if (!text.empty()) settings.nested_run = detail::parse_python_bool(text, "MLFLOW_NESTED_RUN");
    return settings;
  }
};

/// Accelerate's MLflowTracker: a run of an MLflow experiment on a tracking server, through MLflow's REST API.
/// `init_trackers`' configuration becomes the run's params (as Python's `str` writes the values; values longer than
/// MLflow's 6000 characters are dropped with a warning, as Accelerate drops them), each `log` call a batch of metrics
/// at its step, `end_training` ends the run (status FINISHED). The requests go out from a background thread: the
/// server being down, slow or failing never stops or slows training (see docs/trackers.md).
class mlflow_tracker final : public general_tracker {
 public:
  explicit mlflow_tracker(const mlflow_settings& settings)
      : logger_(get_logger("accel.tracking")), sender_(sender_config(settings), [this](const std::string& message) {
          std::lock_guard lock(logging_);
          logger_.warning_once(message);
        }) {}
  ~mlflow_tracker() override { finish(); }
  [[nodiscard]] std::string name() const override { return std::string(tracker_name(tracker::mlflow)); }

  void store_init_configuration(const hyperparameters& config) override {
    std::vector<std::string> dropped;
    const auto params = params_of(config, dropped);
    for (const auto& name : dropped) {
      std::lock_guard lock(logging_);
      logger_.warning_once("accel is attempting to log a value for key \"" + name +
                           "\" as a parameter. MLflow's log_param() only accepts values no longer than " +
                           std::to_string(detail::mlflow_max_param_length) +
                           " characters so we dropped this attribute.");
    }
    for (std::size_t i = 0; i < params.size(); i += detail::mlflow_max_params_per_batch) {
      const auto end = std::min(params.size(), i + detail::mlflow_max_params_per_batch);
      const detail::mlflow_pairs batch(params.begin() + static_cast<std::ptrdiff_t>(i),
                                       params.begin() + static_cast<std::ptrdiff_t>(end));
      sender_.submit({"/api/2.0/mlflow/runs/log-batch", detail::mlflow_log_batch_fields({}, batch, {}), true});
    }
  }

  /// The params of `config` as Accelerate's MLflowTracker logs them: each value as `str(value)`, those longer than
  /// MLflow's limit left out (their names added to `dropped`).
  static detail::mlflow_pairs params_of(const hyperparameters& config, std::vector<std::string>& dropped) {
    detail::mlflow_pairs params;
    for (const auto& entry : config) {
      auto text = param_text(entry.value);
      if (text.size() <= detail::mlflow_max_param_length)
        params.emplace_back(entry.name, std::move(text));
      else
        dropped.push_back(entry.name);
    }
    return params;
  }

  /// Queues the metrics (a batch per 1000); returns at once.
  void log(const std::vector<metric>& metrics, std::int64_t step) override {
    const auto now = detail::unix_millis();
    std::vector<detail::mlflow_metric> batch;
    for (const auto& m : metrics) {
      batch.push_back({m.name, m.value(), now, step});
      if (batch.size() == detail::mlflow_max_metrics_per_batch) submit_metrics(std::exchange(batch, {}));
    }
    if (!batch.empty()) submit_metrics(std::move(batch));
  }

  /// Ends the run (status FINISHED), waiting at most `finish_timeout` for the queued requests.
  void finish() override {
    sender_.finish(detail::mlflow_request{"/api/2.0/mlflow/runs/update",
                                          detail::mlflow_update_fields("FINISHED", detail::unix_millis()), true});
  }

  /// The run's id once the server has created it; "" before (or when it never answered).
  [[nodiscard]] std::string run_id() const { return sender_.run_id(); }
  /// Metric batches dropped because the queue was full.
  [[nodiscard]] std::size_t dropped() const { return sender_.dropped(); }

  /// A param's text as Accelerate's `str(value)` makes it: True/False, 32, 0.001, 1e-05, text as is.
  static std::string param_text(const hyperparameter::value_type& value) {
    return std::visit(
        [](const auto& v) -> std::string {
          using type = std::remove_cvref_t<decltype(v)>;
          if constexpr (std::is_same_v<type, bool>)
            return v ? "True" : "False";
          else if constexpr (std::is_same_v<type, std::int64_t>)
            return std::to_string(v);
          else if constexpr (std::is_same_v<type, double>)
            return detail::python_float_text(v);
          else
            return v;
        },
        value);
  }

 private:
  void submit_metrics(std::vector<detail::mlflow_metric> batch) {
    sender_.submit({"/api/2.0/mlflow/runs/log-batch", detail::mlflow_log_batch_fields(batch, {}, {}), false});
  }
  static detail::mlflow_sender_config sender_config(const mlflow_settings& settings) {
    if (settings.tracking_uri.empty())
      throw std::invalid_argument(
          "accel::mlflow_tracker: no tracking server; set MLFLOW_TRACKING_URI=http://HOST:PORT (start one with "
          "`mlflow server --host 127.0.0.1 --port 5000`) or mlflow_settings::tracking_uri");
    if (settings.experiment_name.empty())
      throw std::invalid_argument("accel::mlflow_tracker: the experiment name is empty; set MLFLOW_EXPERIMENT_NAME");
    detail::mlflow_sender_config config{
        .endpoint = detail::parse_http_uri(settings.tracking_uri, "the MLflow tracking URI (MLFLOW_TRACKING_URI)"),
        .experiment_name = settings.experiment_name,
        .run_name = settings.run_name,
        .run_id = settings.run_id,
        .tags = settings.tags,
        .timeouts = {settings.connect_timeout, settings.response_timeout},
        .queue_capacity = settings.queue_capacity,
        .max_backoff = settings.max_backoff,
        .finish_timeout = settings.finish_timeout};
    if (!settings.description.empty()) config.tags.emplace_back("mlflow.note.content", settings.description);
    config.tags.emplace_back("mlflow.source.type", "LOCAL");
    if (const char* user = std::getenv("USER")) config.tags.emplace_back("mlflow.user", user);
    return config;
  }

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
  tracker_set(std::vector<tracker> log_with, const project_options& project)
      : log_with_(std::move(log_with)),
        root_(project.logging_dir.empty() ? project.project_dir : project.logging_dir) {}
  tracker_set(const tracker_set&) = delete;
  tracker_set& operator=(const tracker_set&) = delete;
  ~tracker_set() {
    try {
      finish();
    } catch (const std::exception& e) {  // a destructor must not throw; the training itself is done
      std::cerr << "accel: closing the trackers failed: " << e.what() << '\n';
    }
  }

  /// On the main process: the built-in trackers of `log_with` in the run directory (created, with the
  /// configuration as `config.json`; none without them), then `extra`; every tracker gets the configuration.
  /// Elsewhere it only records that tracking started.
  void start(const std::string& project_name, const hyperparameters& config,
             std::vector<std::shared_ptr<general_tracker>> extra, bool main_process) {
    check(project_name, config);
    finish();  // a second init_trackers starts a new run
    started_ = true;
    log_calls_ = 0;
    if (!main_process) return;
    if (!log_with_.empty()) {
      const auto directory = make_run_directory(project_name);
      write_config(directory / "config.json", config);
      for (const auto kind : log_with_) active_.push_back(make(kind, directory, project_name));
    }
    for (auto& tracker : extra)
      if (tracker) active_.push_back(std::move(tracker));
    for (const auto& tracker : active_) tracker->store_init_configuration(config);
  }

  /// Sends `metrics` to every tracker at `step` (default: the number of earlier calls).
  void log(const std::vector<metric>& metrics, std::optional<std::int64_t> step, bool main_process) {
    if (!started_ && !log_with_.empty())
      throw std::logic_error(
          "accel::accelerator::log: options::log_with names trackers that are not started yet; call "
          "acc.init_trackers(\"project\") first");
    check_names(metrics);  // on every process, so that a mistake shows wherever it is made
    const auto at = step.value_or(log_calls_);
    ++log_calls_;
    if (!main_process) return;
    for (const auto& tracker : active_) tracker->log(metrics, at);
  }

  /// A name twice in one call, or one of metrics.jsonl's own fields, would make keys that shadow each other.
  static void check_names(const std::vector<metric>& metrics) {
    for (std::size_t i = 0; i < metrics.size(); ++i) {
      if (metrics[i].name == "step" || metrics[i].name == "wall_time")
        throw std::invalid_argument("accel::accelerator::log: a metric may not be called '" + metrics[i].name +
                                    "': the trackers record the step and the time themselves; rename it");
      for (std::size_t j = 0; j < i; ++j)
        if (metrics[j].name == metrics[i].name)
          throw std::invalid_argument("accel::accelerator::log: metric '" + metrics[i].name +
                                      "' is given twice in one call; log each name once per step");
    }
  }

  /// Finishes every tracker, once. They stay alive with the accelerator, so that references from `get` never dangle.
  void finish() {
    auto finishing = std::move(active_);
    active_.clear();
    for (const auto& tracker : finishing) {
      finished_.push_back(tracker);
      tracker->finish();
    }
  }

  general_tracker& get(std::string_view name, bool main_process) {
    static blank_tracker blank;
    if (!main_process) return blank;
    for (const auto& tracker : active_)
      if (tracker->name() == name) return *tracker;
    throw std::invalid_argument("accel::accelerator::get_tracker: no tracker named \"" + std::string(name) +
                                "\" is active; name it in options::log_with (or pass it to init_trackers) and call "
                                "init_trackers first");
  }

 private:
  static void check(const std::string& project_name, const hyperparameters& config) {
    if (project_name.empty())
      throw std::invalid_argument("accel::init_trackers: the project name is empty; it names the run's directory");
    for (std::size_t i = 0; i < config.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (config[i].name == config[j].name)
          throw std::invalid_argument("accel::init_trackers: the configuration names \"" + config[i].name + "\" twice");
  }
  [[nodiscard]] std::filesystem::path make_run_directory(const std::string& project_name) const {
    const auto directory = root_ / project_name;
    std::error_code error;
    std::filesystem::create_directories(directory, error);
    if (error)
      throw std::runtime_error("accel::init_trackers: cannot create the logging directory " + directory.string() +
                               ": " + error.message() +
                               "; set options::project.logging_dir (or project_dir) to a writable directory");
    return directory;
  }
  static std::shared_ptr<general_tracker> make(tracker kind, const std::filesystem::path& directory,
                                               const std::string& project_name) {
    switch (kind) {
      case tracker::csv:
        return std::make_shared<csv_tracker>(directory);
      case tracker::json_lines:
        return std::make_shared<json_lines_tracker>(directory);
      case tracker::tensorboard:
        return std::make_shared<tensorboard_tracker>(directory);
      case tracker::mlflow:
        return std::make_shared<mlflow_tracker>(mlflow_settings::from_environment(project_name));
    }
    throw std::invalid_argument("accel::init_trackers: options::log_with holds an unknown tracker");
  }
  static void write_config(const std::filesystem::path& file, const hyperparameters& config) {
    std::string json = "{";
    for (std::size_t i = 0; i < config.size(); ++i)
      json += (i == 0 ? "\n  " : ",\n  ") + detail::json_string(config[i].name) + ": " + json_value(config[i].value);
    run_file(file, run_file::overwrite).write(json + (config.empty() ? "}\n" : "\n}\n"));
  }

  std::vector<tracker> log_with_;
  std::filesystem::path root_;
  std::vector<std::shared_ptr<general_tracker>> active_;
  std::vector<std::shared_ptr<general_tracker>> finished_;
  bool started_ = false;
  std::int64_t log_calls_ = 0;
};

}  // namespace detail
}  // namespace accel
