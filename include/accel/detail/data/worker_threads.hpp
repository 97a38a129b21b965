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

#include "../config.hpp"

namespace accel::detail {

class worker_threads {
 public:
  ACCEL_DECL explicit worker_threads(int count);
  worker_threads(const worker_threads&) = delete;
  worker_threads& operator=(const worker_threads&) = delete;
  ACCEL_DECL ~worker_threads();

  /// Queues `job`; it must not throw (a job reports its failure through what it produces).
  ACCEL_DECL void run(std::function<void()> job);

 private:
  ACCEL_DECL void work(const std::stop_token& stop);

  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::jthread> threads_;  // last: stopped and joined before the queue they read goes
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/worker_threads.ipp"
#endif
