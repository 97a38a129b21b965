/// \file
/// What worker_threads.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../worker_threads.hpp"

namespace accel::detail {

worker_threads::worker_threads(int count) {
  threads_.reserve(static_cast<std::size_t>(count));
  // A thread that fails to start leaves the ones started to ~jthread, which stops and joins them.
  for (int i = 0; i < count; ++i) threads_.emplace_back([this](std::stop_token stop) { work(stop); });
}

worker_threads::~worker_threads() {
  {
    std::lock_guard lock(mutex_);
    jobs_.clear();
  }
  for (auto& thread : threads_) thread.request_stop();
  threads_.clear();  // joins, each thread after the job in hand
}

void worker_threads::run(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
}

void worker_threads::work(const std::stop_token& stop) {
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

}  // namespace accel::detail
