/// \file
/// `worker_threads`: a fixed set of threads running jobs in the order they were handed over; what a data
/// loader's `num_workers` are. Destroying it drops the jobs not started, lets the running ones finish and joins
/// every thread, so that nothing outlives it.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

namespace accel::detail {

class worker_threads {
 public:
  explicit worker_threads(int count) {
    threads_.reserve(static_cast<std::size_t>(count));
    // A thread that fails to start leaves the ones started to ~jthread, which stops and joins them.
    for (int i = 0; i < count; ++i) threads_.emplace_back([this](std::stop_token stop) { work(stop); });
  }
  worker_threads(const worker_threads&) = delete;
  worker_threads& operator=(const worker_threads&) = delete;
  ~worker_threads() {
    {
      std::lock_guard lock(mutex_);
      jobs_.clear();
    }
    for (auto& thread : threads_) thread.request_stop();
    threads_.clear();  // joins, each thread after the job in hand
  }

  /// Queues `job`; it must not throw (a job reports its failure through what it produces).
  void run(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
  }

 private:
  void work(const std::stop_token& stop) {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, stop, [this] { return !jobs_.empty(); });
        if (stop.stop_requested()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::jthread> threads_;  // last: stopped and joined before the queue they read goes
};

}  // namespace accel::detail
