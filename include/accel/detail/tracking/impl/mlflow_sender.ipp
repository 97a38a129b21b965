/// \file
/// What mlflow_sender.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../mlflow_sender.hpp"

namespace accel::detail {

bool mlflow_sender::submit(mlflow_request request) {
  std::unique_lock lock(mutex_);
  if (closed_) return false;
  if (!request.essential && queue_.size() >= config_.queue_capacity) {
    ++dropped_;
    lock.unlock();
    warn_("MLflow: " + std::to_string(config_.queue_capacity) +
          " requests are waiting for the server; newer metrics are dropped until it answers "
          "(set mlflow_settings::queue_capacity for more)");
    return false;
  }
  queue_.push_back(std::move(request));
  wake_.notify_all();
  return true;
}

std::string describe_unsent(const std::deque<mlflow_request>& requests, bool run_created) {
  std::size_t metrics = 0, params = 0;
  std::optional<std::pair<std::int64_t, std::int64_t>> steps;
  bool final_status = false;
  for (const auto& request : requests) {
    metrics += request.metrics;
    params += request.params;
    final_status = final_status || request.path.ends_with("/runs/update");
    if (request.metrics > 0)
      steps = steps ? std::pair(std::min(steps->first, request.first_step), std::max(steps->second, request.last_step))
                    : std::pair(request.first_step, request.last_step);
  }
  std::string text;
  if (metrics > 0)
    text += std::to_string(metrics) + " metric values (steps " + std::to_string(steps->first) + " to " +
            std::to_string(steps->second) + ")";
  if (params > 0) text += (text.empty() ? "" : ", ") + std::to_string(params) + " params";
  if (final_status) text += (text.empty() ? "" : ", ") + std::string("the run's final status");
  if (text.empty()) text = std::to_string(requests.size()) + " requests";
  return run_created ? text + (final_status ? " (the run stays RUNNING)" : "") : "the run itself, and " + text;
}

void mlflow_sender::finish(std::optional<mlflow_request> last) {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    if (last) queue_.push_back(std::move(*last));
    closed_ = true;
    if (config_.finish_timeout) deadline_ = http_clock::now() + *config_.finish_timeout;
    wake_.notify_all();
  }
  thread_.join();
  if (!queue_.empty() || !run_id_) {
    const auto server = " to the server at " + config_.endpoint.host + ":" + config_.endpoint.port;
    const auto why = past_deadline() ? "after " + std::to_string(config_.finish_timeout->count()) +
                                           " ms at the end of training (finish_timeout)"
                                     : "at the end of training, after " + std::to_string(config_.max_retries) +
                                           " retries of a request (" + last_failure_ + ")";
    warn_("MLflow: gave up " + why + "; not sent" + server + ": " + describe_unsent(queue_, run_id_.has_value()));
  }
  if (dropped_ > 0) warn_("MLflow: " + std::to_string(dropped_) + " metric batches were dropped (queue full)");
}

std::string mlflow_sender::run_id() const {
  std::lock_guard lock(mutex_);
  return run_id_.value_or("");
}

std::size_t mlflow_sender::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

void mlflow_sender::run() {
  auto backoff = std::chrono::milliseconds(100);
  for (;;) {
    std::optional<mlflow_request> next;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return !run_id_ || !queue_.empty() || closed_; });
      if (past_deadline() || (closed_ && queue_.empty() && run_id_)) return;
      if (run_id_ && !queue_.empty()) next = queue_.front();
    }
    if (attempt(next)) {
      backoff = std::chrono::milliseconds(100);
      continue;
    }
    if (give_up_after_failure()) return;
    std::unique_lock lock(mutex_);
    const auto until = std::min(http_clock::now() + backoff, deadline_.value_or(http_clock::time_point::max()));
    wake_.wait_until(lock, until, [&] { return past_deadline(); });
    backoff = std::min(backoff * 2, config_.max_backoff);
  }
}

bool mlflow_sender::give_up_after_failure() {
  std::lock_guard lock(mutex_);
  return closed_ && ++failures_since_finish_ > config_.max_retries;
}

bool mlflow_sender::attempt(const std::optional<mlflow_request>& next) {
  try {
    if (!next) return start_run();
    const auto response = post(next->path, mlflow_run_body(current_run(), next->fields));
    if (response.status >= 500 || response.status == 429) return server_failed(response);
    if (response.status >= 400)
      warn_("MLflow rejected a request to " + next->path + " (HTTP " + std::to_string(response.status) +
            "), which is dropped: " + response.body.substr(0, 500));
    std::lock_guard lock(mutex_);
    queue_.pop_front();
    recovered();
    return true;
  } catch (const http_error& e) {
    unreachable(e.what());
    return false;
  }
}

bool mlflow_sender::start_run() {
  if (!config_.run_id.empty()) {
    const auto response =
        post("/api/2.0/mlflow/runs/update", mlflow_run_body(config_.run_id, mlflow_update_fields("RUNNING", 0)));
    if (!accepted(response, "resuming run " + config_.run_id)) return false;
    std::lock_guard lock(mutex_);  // a resumed run gets its tags as a batch, first
    queue_.push_front({"/api/2.0/mlflow/runs/log-batch", mlflow_log_batch_fields({}, {}, config_.tags), true});
    run_id_ = config_.run_id;
    recovered();
    return true;
  }
  const auto experiment = experiment_id();
  if (!experiment) return false;
  const auto response = post("/api/2.0/mlflow/runs/create",
                             mlflow_create_run_body(*experiment, config_.run_name, unix_millis(), config_.tags));
  if (!accepted(response, "creating a run")) return false;
  const auto id = json_string_field(response.body, "run_id");
  if (!id) throw http_error("MLflow's runs/create answer holds no run_id: " + response.body.substr(0, 200));
  return set_run(*id);
}

std::optional<std::string> mlflow_sender::experiment_id() {
  const auto by_name = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + url_encode(config_.experiment_name);
  for (int tries = 0; tries < 2; ++tries) {
    auto found = send("GET", by_name, "");
    if (found.status == 200) return json_string_field(found.body, "experiment_id");
    if (found.status != 404) return accepted(found, "finding the experiment"), std::nullopt;
    auto made = post("/api/2.0/mlflow/experiments/create", "{\"name\": " + json_string(config_.experiment_name) + "}");
    if (made.status == 200) return json_string_field(made.body, "experiment_id");
    if (made.status < 400 || made.status >= 500) return accepted(made, "creating the experiment"), std::nullopt;
  }
  warn_("MLflow: cannot find or create experiment \"" + config_.experiment_name + "\"; retrying");
  return std::nullopt;
}

bool mlflow_sender::accepted(const http_response& response, const std::string& doing) {
  if (response.status == 200) return true;
  if (response.status >= 500 || response.status == 429) return server_failed(response);
  warn_("MLflow refused " + doing + " (HTTP " + std::to_string(response.status) + "): " + response.body.substr(0, 500) +
        "; retrying");
  return false;
}

bool mlflow_sender::set_run(const std::string& id) {
  std::lock_guard lock(mutex_);
  run_id_ = id;
  recovered();
  return true;
}

std::string mlflow_sender::current_run() const {
  std::lock_guard lock(mutex_);
  return *run_id_;
}

http_response mlflow_sender::send(std::string_view method, const std::string& path, const std::string& body) {
  auto timeouts = config_.timeouts;
  {
    std::lock_guard lock(mutex_);
    if (closed_ && deadline_) {  // while finishing, no request outlives the deadline
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline_ - http_clock::now());
      const auto bounded = std::max(left, std::chrono::milliseconds(1));
      timeouts = {std::min(timeouts.connect, bounded), std::min(timeouts.response, bounded)};
    }
  }
  return http_exchange(config_.endpoint, http_request_text(config_.endpoint, method, path, body), timeouts);
}

bool mlflow_sender::server_failed(const http_response& response) {
  unreachable("HTTP " + std::to_string(response.status) + " " + response.body.substr(0, 200));
  return false;
}

void mlflow_sender::unreachable(const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    last_failure_ = why;
  }
  if (std::exchange(failing_, true)) return;
  warn_("MLflow tracking server at " + config_.endpoint.host + ":" + config_.endpoint.port + " is not answering (" +
        why + "); training goes on, requests are queued and retried");
}

}  // namespace accel::detail
