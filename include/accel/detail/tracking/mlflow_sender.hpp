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

#include "../config.hpp"
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
  /// Once training has ended, a request is given up after this many retries (each attempt bounded by `timeouts`);
  /// before, requests are retried as long as training runs.
  int max_retries = 7;
  /// The longest `finish` waits in all; none: as long as the server takes the requests within their retries.
  std::optional<std::chrono::milliseconds> finish_timeout{};
};

/// One request about the run: its REST path and its body after `"run_id"`. `essential` requests (params, tags, the
/// final status) are queued even when the queue is full; metric batches are dropped then. What it carries (its
/// metric values and their steps, its params) is what a warning says was not sent.
struct mlflow_request {
  std::string path;
  std::string fields;
  bool essential = false;
  std::size_t metrics = 0;
  std::int64_t first_step = 0;
  std::int64_t last_step = 0;
  std::size_t params = 0;
};

/// What `requests` carry, in words: "75 metric values (steps 21 to 95), 8 params, the run's final status (the run
/// stays RUNNING)"; without `run_created`, the run itself first.
ACCEL_DECL std::string describe_unsent(const std::deque<mlflow_request>& requests, bool run_created);

class mlflow_sender {
 public:
  /// `warn` is called from the sender thread (and `submit`) for each failure worth a line; it dedupes itself.
  mlflow_sender(mlflow_sender_config config, std::function<void(const std::string&)> warn)
      : config_(std::move(config)), warn_(std::move(warn)), thread_([this] { run(); }) {}
  mlflow_sender(const mlflow_sender&) = delete;
  mlflow_sender& operator=(const mlflow_sender&) = delete;
  ~mlflow_sender() { finish(std::nullopt); }

  /// Queues `request`, never blocking on the network; false when it was dropped (the queue is full).
  ACCEL_DECL bool submit(mlflow_request request);

  /// Queues `last` (the run's final status), then waits for everything to be sent: each request given up after
  /// `max_retries` retries, everything after `finish_timeout` when there is one; what was not sent is said in one
  /// warning. Idempotent.
  ACCEL_DECL void finish(std::optional<mlflow_request> last);

  /// The run's id once created (or resumed), else "".
  [[nodiscard]] ACCEL_DECL std::string run_id() const;
  [[nodiscard]] ACCEL_DECL std::size_t dropped() const;

 private:
  ACCEL_DECL void run();

  /// Creates the run (when there is none yet) or sends `next`; false to retry later. A request the server rejects
  /// as invalid (4xx) would fail again: it is dropped with a warning.
  ACCEL_DECL bool attempt(const std::optional<mlflow_request>& next);

  /// Finds or creates the experiment, then creates the run (or marks the given one running again).
  ACCEL_DECL bool start_run();

  /// The experiment's id: found by name, else created (found again if another process created it meanwhile).
  ACCEL_DECL std::optional<std::string> experiment_id();

  ACCEL_DECL bool accepted(const http_response& response, const std::string& doing);
  ACCEL_DECL bool set_run(const std::string& id);
  ACCEL_DECL std::string current_run() const;

  http_response post(const std::string& path, const std::string& body) { return send("POST", path, body); }
  ACCEL_DECL http_response send(std::string_view method, const std::string& path, const std::string& body);

  ACCEL_DECL bool server_failed(const http_response& response);
  /// Warns once per outage: the first failure, not each retry.
  ACCEL_DECL void unreachable(const std::string& why);
  void recovered() {  // under mutex_
    failing_ = false;
    failures_since_finish_ = 0;
  }
  [[nodiscard]] bool past_deadline() const { return closed_ && deadline_ && http_clock::now() >= *deadline_; }
  /// After a failed attempt: whether finishing has given up (`max_retries` retries of one request since it began).
  ACCEL_DECL bool give_up_after_failure();

  mlflow_sender_config config_;
  std::function<void(const std::string&)> warn_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<mlflow_request> queue_;
  std::optional<std::string> run_id_;
  std::size_t dropped_ = 0;
  bool closed_ = false;
  bool failing_ = false;
  std::optional<http_clock::time_point> deadline_{};
  int failures_since_finish_ = 0;  // of the request at the head, once closed
  std::string last_failure_;       // the last reason a request failed, for the warning at the end
  std::thread thread_;             // last: started once everything it reads exists
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/mlflow_sender.ipp"
#endif
