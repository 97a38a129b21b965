/// \file
/// `mlflow_sender`: the thread that sends an MLflow run's requests, so that training never waits for the server.
/// It gets or creates the experiment, creates (or resumes) the run, then sends the queued requests in order, each
/// retried with a bounded backoff while the server is down, slow or failing (5xx); `finish` waits a bounded time.
// IWYU pragma: private, include <accel/tracking.hpp>
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "http.hpp"
#include "mlflow.hpp"

namespace accel::detail {

/// What identifies the run and bounds the sending (see `accel::mlflow_settings`).
struct mlflow_sender_config {
  http_endpoint endpoint;
  std::string experiment_name;
  std::string run_name;
  std::string run_id;  // resume this run instead of creating one
  mlflow_pairs tags;
  http_timeouts timeouts;
  std::size_t queue_capacity = 10000;
  std::chrono::milliseconds max_backoff{2000};
  std::chrono::milliseconds finish_timeout{10000};
};

/// One request about the run: its REST path and its body after `"run_id"`. `essential` requests (params, tags, the
/// final status) are queued even when the queue is full; metric batches are dropped then.
struct mlflow_request {
  std::string path;
  std::string fields;
  bool essential = false;
};

class mlflow_sender {
 public:
  /// `warn` is called from the sender thread (and `submit`) for each failure worth a line; it dedupes itself.
  mlflow_sender(mlflow_sender_config config, std::function<void(const std::string&)> warn)
      : config_(std::move(config)), warn_(std::move(warn)), thread_([this] { run(); }) {}
  mlflow_sender(const mlflow_sender&) = delete;
  mlflow_sender& operator=(const mlflow_sender&) = delete;
  ~mlflow_sender() { finish(std::nullopt); }

  /// Queues `request`, never blocking on the network; false when it was dropped (the queue is full).
  bool submit(mlflow_request request) {
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

  /// Queues `last` (the run's final status), then waits at most `finish_timeout` for everything to be sent; what
  /// is still queued then is given up, with a warning. Idempotent.
  void finish(std::optional<mlflow_request> last) {
    {
      std::lock_guard lock(mutex_);
      if (closed_) return;
      if (last) queue_.push_back(std::move(*last));
      closed_ = true;
      deadline_ = http_clock::now() + config_.finish_timeout;
      wake_.notify_all();
    }
    thread_.join();
    if (!queue_.empty() || !run_id_)
      warn_("MLflow: gave up after " + std::to_string(config_.finish_timeout.count()) +
            " ms at the end of training: " + std::to_string(queue_.size()) + " requests were not sent (the server at " +
            config_.endpoint.host + ":" + config_.endpoint.port + " did not take them)");
    if (dropped_ > 0) warn_("MLflow: " + std::to_string(dropped_) + " metric batches were dropped (queue full)");
  }

  /// The run's id once created (or resumed), else "".
  [[nodiscard]] std::string run_id() const {
    std::lock_guard lock(mutex_);
    return run_id_.value_or("");
  }
  [[nodiscard]] std::size_t dropped() const {
    std::lock_guard lock(mutex_);
    return dropped_;
  }

 private:
  void run() {
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
      std::unique_lock lock(mutex_);
      const auto until = std::min(http_clock::now() + backoff, closed_ ? deadline_ : http_clock::time_point::max());
      wake_.wait_until(lock, until, [&] { return past_deadline(); });
      backoff = std::min(backoff * 2, config_.max_backoff);
    }
  }

  /// Creates the run (when there is none yet) or sends `next`; false to retry later. A request the server rejects
  /// as invalid (4xx) would fail again: it is dropped with a warning.
  bool attempt(const std::optional<mlflow_request>& next) {
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

  /// Finds or creates the experiment, then creates the run (or marks the given one running again).
  bool start_run() {
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

  /// The experiment's id: found by name, else created (found again if another process created it meanwhile).
  std::optional<std::string> experiment_id() {
    const auto by_name =
        "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + url_encode(config_.experiment_name);
    for (int tries = 0; tries < 2; ++tries) {
      auto found = send("GET", by_name, "");
      if (found.status == 200) return json_string_field(found.body, "experiment_id");
      if (found.status != 404) return accepted(found, "finding the experiment"), std::nullopt;
      auto made =
          post("/api/2.0/mlflow/experiments/create", "{\"name\": " + json_string(config_.experiment_name) + "}");
      if (made.status == 200) return json_string_field(made.body, "experiment_id");
      if (made.status < 400 || made.status >= 500) return accepted(made, "creating the experiment"), std::nullopt;
    }
    warn_("MLflow: cannot find or create experiment \"" + config_.experiment_name + "\"; retrying");
    return std::nullopt;
  }

  bool accepted(const http_response& response, const std::string& doing) {
    if (response.status == 200) return true;
    if (response.status >= 500 || response.status == 429) return server_failed(response);
    warn_("MLflow refused " + doing + " (HTTP " + std::to_string(response.status) +
          "): " + response.body.substr(0, 500) + "; retrying");
    return false;
  }
  bool set_run(const std::string& id) {
    std::lock_guard lock(mutex_);
    run_id_ = id;
    recovered();
    return true;
  }
  std::string current_run() const {
    std::lock_guard lock(mutex_);
    return *run_id_;
  }

  http_response post(const std::string& path, const std::string& body) { return send("POST", path, body); }
  http_response send(std::string_view method, const std::string& path, const std::string& body) {
    auto timeouts = config_.timeouts;
    {
      std::lock_guard lock(mutex_);
      if (closed_) {  // while finishing, no request outlives the deadline
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - http_clock::now());
        const auto bounded = std::max(left, std::chrono::milliseconds(1));
        timeouts = {std::min(timeouts.connect, bounded), std::min(timeouts.response, bounded)};
      }
    }
    return http_exchange(config_.endpoint, http_request_text(config_.endpoint, method, path, body), timeouts);
  }

  bool server_failed(const http_response& response) {
    unreachable("HTTP " + std::to_string(response.status) + " " + response.body.substr(0, 200));
    return false;
  }
  /// Warns once per outage: the first failure, not each retry.
  void unreachable(const std::string& why) {
    if (std::exchange(failing_, true)) return;
    warn_("MLflow tracking server at " + config_.endpoint.host + ":" + config_.endpoint.port + " is not answering (" +
          why + "); training goes on, requests are queued and retried");
  }
  void recovered() { failing_ = false; }  // under mutex_ or on the sender thread only
  [[nodiscard]] bool past_deadline() const { return closed_ && http_clock::now() >= deadline_; }

  mlflow_sender_config config_;
  std::function<void(const std::string&)> warn_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<mlflow_request> queue_;
  std::optional<std::string> run_id_;
  std::size_t dropped_ = 0;
  bool closed_ = false;
  bool failing_ = false;
  http_clock::time_point deadline_{};
  std::thread thread_;  // last: started once everything it reads exists
};

}  // namespace accel::detail
