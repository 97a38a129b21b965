// A soak under `accel launch --nproc_per_node 2`: 20,000 training steps of data_parallel<gloo> (an MLP with dropout,
// AdamW, a shuffled data loader) with a save_state + load_state cycle every 100 steps (200 cycles), each process's
// resident set sampled every second. After a warm-up (the first 10% of the steps) the resident set should stay
// flat: a leak per step or per checkpoint shows as growth. Prints each process's samples summary; the main process
// prints the table for docs/performance.md. RSS is reported, not asserted (it depends on the allocator).
//   bench_soak [STEPS] [CYCLE] [DIR]
#include <accel/accel.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../tests/support/resident.hpp"

namespace {

using accel_test::resident_bytes;

struct sample {
  double seconds;
  std::int64_t step;
  std::int64_t rss;
};

/// Samples the resident set every second on a thread of its own, with the step reached, until destroyed.
class rss_sampler {
 public:
  explicit rss_sampler(const std::atomic<std::int64_t>& step) : step_(step), thread_([this] { run(); }) {}
  rss_sampler(const rss_sampler&) = delete;
  rss_sampler& operator=(const rss_sampler&) = delete;
  ~rss_sampler() { stop(); }
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  [[nodiscard]] const std::vector<sample>& samples() const { return samples_; }

 private:
  void run() {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock lock(mutex_);
    do {
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
      samples_.push_back({elapsed.count(), step_.load(), resident_bytes()});
    } while (!wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_; }));
  }
  const std::atomic<std::int64_t>& step_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<sample> samples_;
  std::thread thread_;
};

struct mlp_impl : torch::nn::Module {
  mlp_impl()
      : fc1(register_module("fc1", torch::nn::Linear(32, 256))),
        drop(register_module("drop", torch::nn::Dropout(0.1))),
        fc2(register_module("fc2", torch::nn::Linear(256, 32))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(drop(torch::relu(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};
TORCH_MODULE_IMPL(mlp, mlp_impl);

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t steps = argc > 1 ? std::atoll(argv[1]) : 20000;
  const std::int64_t cycle = argc > 2 ? std::atoll(argv[2]) : 100;
  const auto dir = std::filesystem::path(argc > 3 ? argv[3] : "/tmp/accel_soak") /
                   (std::getenv("MASTER_PORT") ? std::getenv("MASTER_PORT") : "0");
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc{{.cpu = true}};
  torch::manual_seed(0);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  for (int i = 0; i < 1024; ++i) data.emplace_back(torch::randn({32}), torch::randn({32}));
  mlp net;
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  accel::data_loader loader(data, {.batch_size = 16, .shuffle = true, .seed = 1});
  auto [model, opt, batches] = acc.prepare(net, adamw, loader);

  std::atomic<std::int64_t> step{0};
  rss_sampler sampler(step);
  const auto start = std::chrono::steady_clock::now();
  while (step < steps)
    for (auto&& [x, y] : batches) {
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      opt.zero_grad();
      if (++step % cycle == 0) {
        acc.save_state(dir);
        acc.load_state(dir);
      }
      if (step == steps) break;
    }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  sampler.stop();

  // After the warm-up: the first sample at or past 10% of the steps, the largest and the last.
  const auto& samples = sampler.samples();
  const sample* warm = nullptr;
  std::int64_t largest = 0;
  for (const auto& s : samples) {
    if (!warm && s.step >= steps / 10) warm = &s;
    if (warm) largest = std::max(largest, s.rss);
  }
  const auto after_warmup = warm ? warm->rss : samples.back().rss;
  auto summary = torch::tensor({static_cast<double>(samples.size()), mib(after_warmup), mib(largest),
                                mib(samples.back().rss), mib(largest - after_warmup)},
                               torch::kDouble);
  const auto all = acc.gather(summary.unsqueeze(0));
  if (acc.is_main_process()) {
    std::printf("soak: %lld steps, a save_state + load_state every %lld steps (%lld cycles), %d processes, %.1f s\n",
                static_cast<long long>(steps), static_cast<long long>(cycle), static_cast<long long>(steps / cycle),
                acc.num_processes(), elapsed.count());
    std::printf("%-8s %8s %16s %14s %10s %16s\n", "process", "samples", "RSS after warm-up", "largest after", "last",
                "growth after");
    for (int r = 0; r < acc.num_processes(); ++r) {
      const auto row = all[r];
      std::printf("%-8d %8.0f %13.1f MiB %10.1f MiB %6.1f MiB %12.1f MiB\n", r, row[0].item<double>(),
                  row[1].item<double>(), row[2].item<double>(), row[3].item<double>(), row[4].item<double>());
    }
    accel::detail::remove_tree(dir);
  }
  return 0;
}
