/// \file
/// What tracking.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../tracking.hpp"

namespace accel {

metric::metric(std::string metric_name, at::Tensor tensor) : name(std::move(metric_name)), value_(std::move(tensor)) {
  check_one_element(std::get<at::Tensor>(value_));
}

double metric::value() const {
  if (const auto* number = std::get_if<double>(&value_)) return *number;
  if (!read_) read_ = std::get<at::Tensor>(value_).item<double>();
  return *read_;
}

void metric::check_one_element(const at::Tensor& tensor) const {
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
}  // namespace accel

namespace accel::detail {

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string number_text(double value, std::string_view nan, std::string_view infinity) {
  if (std::isnan(value)) return std::string(nan);
  if (std::isinf(value)) return (value < 0 ? "-" : "") + std::string(infinity);
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, value).ptr);
}

std::string json_value(const hyperparameter::value_type& value) {
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

std::string csv_field(std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(text);
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

run_file::run_file(std::filesystem::path path, mode how)
    : path_(std::move(path)), file_(std::fopen(path_.c_str(), how == append ? "ab" : "wb")) {
  if (!file_) fail("cannot open");
  std::fseek(file_.get(), 0, SEEK_END);  // where appending starts: 0 for a new file
  was_empty_ = std::ftell(file_.get()) == 0;
}

void run_file::write(std::string_view text) {
  if (!file_)
    throw std::logic_error("accel: " + path_.string() +
                           " is closed (the tracker has finished); log before end_training()");
  if (std::fwrite(text.data(), 1, text.size(), file_.get()) != text.size() || std::fflush(file_.get()) != 0)
    fail("cannot write to");
}

void run_file::fail(const std::string& what) const {
  throw std::runtime_error("accel: " + what + " " + path_.string() + ": " + std::strerror(errno) +
                           "; make options::project.logging_dir a writable directory with free space");
}
}  // namespace accel::detail

namespace accel {

csv_tracker::csv_tracker(const std::filesystem::path& run_directory)
    : file_(run_directory / "metrics.csv", detail::run_file::append) {
  if (file_.was_empty()) file_.write("wall_time,step,name,value\n");
}

void csv_tracker::log(const std::vector<metric>& metrics, std::int64_t step) {
  const auto prefix = detail::json_number(detail::wall_time()) + "," + std::to_string(step) + ",";
  std::string rows;
  for (const auto& m : metrics)
    rows += prefix + detail::csv_field(m.name) + "," + detail::number_text(m.value(), "nan", "inf") + "\n";
  file_.write(rows);
}

void json_lines_tracker::log(const std::vector<metric>& metrics, std::int64_t step) {
  std::string line =
      "{\"step\": " + std::to_string(step) + ", \"wall_time\": " + detail::json_number(detail::wall_time());
  for (const auto& m : metrics) line += ", " + detail::json_string(m.name) + ": " + detail::json_number(m.value());
  file_.write(line + "}\n");
}

void tensorboard_tracker::log(const std::vector<metric>& metrics, std::int64_t step) {
  const auto now = detail::wall_time();
  std::string records;
  for (const auto& m : metrics)
    records += detail::tfrecord(detail::scalar_event(now, step, m.name, static_cast<float>(m.value())));
  file_.write(records);
}

tensorboard_tracker::tensorboard_tracker(const std::filesystem::path& run_directory, double now)
    : path_(run_directory / detail::event_file_name(static_cast<std::int64_t>(now))),
      file_(path_, detail::run_file::append) {
  file_.write(detail::tfrecord(detail::file_version_event(now)));
}

mlflow_settings mlflow_settings::from_environment(std::string experiment, const mlflow_options& bounds) {
  mlflow_settings settings;
  settings.experiment_name = std::move(experiment);
  settings.response_timeout = bounds.request_timeout;
  settings.max_retries = bounds.max_retries;
  settings.finish_timeout = bounds.finish_timeout;
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
  text.clear();
  read("MLFLOW_HTTP_REQUEST_TIMEOUT", text);
  if (!text.empty())
    settings.response_timeout =
        std::chrono::seconds(detail::parse_whole_number(text, "MLFLOW_HTTP_REQUEST_TIMEOUT", 1, 24 * 3600));
  text.clear();
  read("MLFLOW_HTTP_REQUEST_MAX_RETRIES", text);
  if (!text.empty())
    settings.max_retries =
        static_cast<int>(detail::parse_whole_number(text, "MLFLOW_HTTP_REQUEST_MAX_RETRIES", 0, 1000));
  return settings;
}

mlflow_tracker::mlflow_tracker(const mlflow_settings& settings)
    : logger_(get_logger("accel.tracking")), sender_(sender_config(settings), [this](const std::string& message) {
        std::lock_guard lock(logging_);
        logger_.warning_once(message);
      }) {}

void mlflow_tracker::store_init_configuration(const hyperparameters& config) {
  std::vector<std::string> dropped;
  const auto params = params_of(config, dropped);
  for (const auto& name : dropped) {
    std::lock_guard lock(logging_);
    logger_.warning_once("accel is attempting to log a value for key \"" + name +
                         "\" as a parameter. MLflow's log_param() only accepts values no longer than " +
                         std::to_string(detail::mlflow_max_param_length) + " characters so we dropped this attribute.");
  }
  for (std::size_t i = 0; i < params.size(); i += detail::mlflow_max_params_per_batch) {
    const auto end = std::min(params.size(), i + detail::mlflow_max_params_per_batch);
    const detail::mlflow_pairs batch(params.begin() + static_cast<std::ptrdiff_t>(i),
                                     params.begin() + static_cast<std::ptrdiff_t>(end));
    sender_.submit({.path = "/api/2.0/mlflow/runs/log-batch",
                    .fields = detail::mlflow_log_batch_fields({}, batch, {}),
                    .essential = true,
                    .params = batch.size()});
  }
}

detail::mlflow_pairs mlflow_tracker::params_of(const hyperparameters& config, std::vector<std::string>& dropped) {
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

void mlflow_tracker::log(const std::vector<metric>& metrics, std::int64_t step) {
  const auto now = detail::unix_millis();
  std::vector<detail::mlflow_metric> batch;
  for (const auto& m : metrics) {
    batch.push_back({m.name, m.value(), now, step});
    if (batch.size() == detail::mlflow_max_metrics_per_batch) submit_metrics(std::exchange(batch, {}));
  }
  if (!batch.empty()) submit_metrics(std::move(batch));
}

void mlflow_tracker::finish() {
  sender_.finish(detail::mlflow_request{.path = "/api/2.0/mlflow/runs/update",
                                        .fields = detail::mlflow_update_fields("FINISHED", detail::unix_millis()),
                                        .essential = true});
}

std::string mlflow_tracker::param_text(const hyperparameter::value_type& value) {
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

void mlflow_tracker::submit_metrics(std::vector<detail::mlflow_metric> batch) {
  const auto [first, last] =
      std::minmax_element(batch.begin(), batch.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  sender_.submit({.path = "/api/2.0/mlflow/runs/log-batch",
                  .fields = detail::mlflow_log_batch_fields(batch, {}, {}),
                  .essential = false,
                  .metrics = batch.size(),
                  .first_step = first->step,
                  .last_step = last->step});
}

detail::mlflow_sender_config mlflow_tracker::sender_config(const mlflow_settings& settings) {
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
      .max_retries = settings.max_retries,
      .finish_timeout = settings.finish_timeout};
  if (!settings.description.empty()) config.tags.emplace_back("mlflow.note.content", settings.description);
  config.tags.emplace_back("mlflow.source.type", "LOCAL");
  if (const char* user = std::getenv("USER")) config.tags.emplace_back("mlflow.user", user);
  return config;
}
}  // namespace accel

namespace accel::detail {

tracker_set::tracker_set(std::vector<tracker> log_with, const project_options& project, const mlflow_options& mlflow)
    : log_with_(std::move(log_with)),
      mlflow_(mlflow),
      root_(project.logging_dir.empty() ? project.project_dir : project.logging_dir) {}

tracker_set::~tracker_set() {
  try {
    finish();
  } catch (const std::exception& e) {  // a destructor must not throw; the training itself is done
    std::cerr << "accel: closing the trackers failed: " << e.what() << '\n';
  }
}

void tracker_set::start(const std::string& project_name, const hyperparameters& config,
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

void tracker_set::log(const std::vector<metric>& metrics, std::optional<std::int64_t> step, bool main_process) {
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

void tracker_set::check_names(const std::vector<metric>& metrics) {
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

void tracker_set::finish() {
  auto finishing = std::move(active_);
  active_.clear();
  for (const auto& tracker : finishing) {
    finished_.push_back(tracker);
    tracker->finish();
  }
}

general_tracker& tracker_set::get(std::string_view name, bool main_process) {
  static blank_tracker blank;
  if (!main_process) return blank;
  for (const auto& tracker : active_)
    if (tracker->name() == name) return *tracker;
  throw std::invalid_argument("accel::accelerator::get_tracker: no tracker named \"" + std::string(name) +
                              "\" is active; name it in options::log_with (or pass it to init_trackers) and call "
                              "init_trackers first");
}

void tracker_set::check(const std::string& project_name, const hyperparameters& config) {
  if (project_name.empty())
    throw std::invalid_argument("accel::init_trackers: the project name is empty; it names the run's directory");
  for (std::size_t i = 0; i < config.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (config[i].name == config[j].name)
        throw std::invalid_argument("accel::init_trackers: the configuration names \"" + config[i].name + "\" twice");
}

std::filesystem::path tracker_set::make_run_directory(const std::string& project_name) const {
  const auto directory = root_ / project_name;
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error)
    throw std::runtime_error("accel::init_trackers: cannot create the logging directory " + directory.string() + ": " +
                             error.message() +
                             "; set options::project.logging_dir (or project_dir) to a writable directory");
  return directory;
}

std::shared_ptr<general_tracker> tracker_set::make(tracker kind, const std::filesystem::path& directory,
                                                   const std::string& project_name) const {
  switch (kind) {
    case tracker::csv:
      return std::make_shared<csv_tracker>(directory);
    case tracker::json_lines:
      return std::make_shared<json_lines_tracker>(directory);
    case tracker::tensorboard:
      return std::make_shared<tensorboard_tracker>(directory);
    case tracker::mlflow:
      return std::make_shared<mlflow_tracker>(mlflow_settings::from_environment(project_name, mlflow_));
  }
  throw std::invalid_argument("accel::init_trackers: options::log_with holds an unknown tracker");
}

void tracker_set::write_config(const std::filesystem::path& file, const hyperparameters& config) {
  std::string json = "{";
  for (std::size_t i = 0; i < config.size(); ++i)
    json += (i == 0 ? "\n  " : ",\n  ") + detail::json_string(config[i].name) + ": " + json_value(config[i].value);
  run_file(file, run_file::overwrite).write(json + (config.empty() ? "}\n" : "\n}\n"));
}

}  // namespace accel::detail
