// Does the model wait for data? A dataset whose get costs 1 ms of CPU (spent on the calling thread's CPU clock, so
// a thread that is descheduled takes longer, as real decoding would), a training step of about 4 ms (AdamW on an
// MLP whose width is calibrated to take that here), one process, one intra-op thread: time per step with 0, 1 and
// 2 loader workers against the step over batches already loaded (the limit), for batches of 2 and 4 samples.
// Median over rounds, configurations alternating within a round.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <vector>

#include "support.hpp"

namespace {

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

/// Arithmetic until this thread has had `seconds` of CPU (the clock read every few microseconds: it is a system call).
void spend_cpu(double seconds) {
  const auto start = thread_cpu_seconds();
  volatile double sink = 1;
  while (thread_cpu_seconds() - start < seconds)
    for (int i = 0; i < 2000; ++i) sink = sink * 1.0000001 + 1e-9;
}

/// Samples of `width` features and one target, each costing 1 ms of this thread's CPU to load.
struct costly_samples {
  int width = 0;
  double cost = 1e-3;  // CPU seconds per sample
  [[nodiscard]] std::size_t size() const { return 4096; }
  [[nodiscard]] bench::batch get(std::size_t i) const {
    spend_cpu(cost);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(i));
    return {torch::randn({width}, generator), torch::randn({1}, generator)};
  }
};

struct trainer {
  accel::accelerator<> acc{{.cpu = true}};
  torch::nn::Sequential net;
  torch::optim::AdamW optimizer;
  explicit trainer(int width) : net(bench::wide_mlp(width)), optimizer(net->parameters(), 1e-4) {}

  /// Seconds per step over `steps` steps of `batches` after `warmup` untimed ones (the workers starting).
  template <class Batches>
  double seconds_per_step(Batches& batches, int steps, int warmup) {
    int done = 0;
    auto start = bench::clock_type::now();
    for (auto&& [x, y] : batches) {
      if (done == warmup) start = bench::clock_type::now();
      optimizer.zero_grad();
      torch::mse_loss(net->forward(x), y).backward();
      optimizer.step();
      if (++done == warmup + steps) break;
    }
    return bench::seconds_since(start) / steps;
  }
};

double with_workers(trainer& t, const costly_samples& samples, std::int64_t batch_size, int workers, int steps,
                    int warmup) {
  accel::data_loader loader(samples, {.batch_size = batch_size, .shuffle = true, .num_workers = workers});
  auto prepared = t.acc.prepare(loader);
  return t.seconds_per_step(prepared, steps, warmup);
}

/// The step alone (the limit): the same loop over samples that cost nothing to load.
double model_only(trainer& t, const costly_samples& samples, std::int64_t batch_size, int steps, int warmup) {
  return with_workers(t, {samples.width, 0.0}, batch_size, 0, steps, warmup);
}

/// The step alone while another thread keeps the second core busy with the same arithmetic as loading: what two
/// busy cores of this machine leave the step (they may share a physical core or its caches on the host).
double model_only_beside_busy_core(trainer& t, const costly_samples& samples, std::int64_t batch_size, int steps,
                                   int warmup) {
  std::atomic<bool> done{false};
  std::thread busy([&] {
    while (!done) spend_cpu(1e-3);
  });
  const double seconds = model_only(t, samples, batch_size, steps, warmup);
  done = true;
  busy.join();
  return seconds;
}

/// The width whose step takes about 4 ms here (the cost grows with its square).
int calibrated_width() {
  int width = 256;
  for (int attempt = 0; attempt < 3; ++attempt) {
    trainer t(width);
    std::vector<double> times;
    for (int r = 0; r < 3; ++r) times.push_back(model_only(t, {width}, 2, 40, 5));
    const double scale = std::sqrt(4e-3 / bench::median(times));
    width = std::clamp(static_cast<int>(std::lround(width * scale / 32.0)) * 32, 64, 4096);
  }
  return width;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 50;
  const double cost = argc > 3 ? std::atof(argv[3]) * 1e-3 : 1e-3;  // ms of CPU per sample
  const int warmup = 10;
  torch::set_num_threads(1);
  // The model trains on throughout; denormal values in its weights would slow its step down as the run goes on.
  at::globalContext().setFlushDenormal(true);
  const int width = calibrated_width();
  const costly_samples samples{width, cost};
  trainer t(width);
  std::printf(
      "data pipeline: a sample costs %.2f ms of CPU to load; AdamW on a %d-wide MLP; median of %d rounds x %d "
      "steps\n",
      cost * 1e3, width, rounds, steps);
  std::printf(
      "| batch | loading (CPU ms) | model only M (ms) | floor on 2 cores | M, other core busy | 0 workers | "
      "1 worker | 2 workers |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (std::int64_t batch_size : {2, 4}) {
    // Per round: M and each configuration, in an order rotated from round to round; a ratio is the median of the
    // rounds' ratios, so that this VM's drift over seconds and any effect of the order cancel.
    std::vector<double> alone, ratios[4];
    for (int r = 0; r < rounds; ++r) {
      double times[5];
      for (int k = 0; k < 5; ++k) {
        const int config = (k + r) % 5;
        if (config == 0)
          times[0] = model_only(t, samples, batch_size, steps, warmup);
        else if (config == 1)
          times[1] = model_only_beside_busy_core(t, samples, batch_size, steps, warmup);
        else
          times[config] = with_workers(t, samples, batch_size, config - 2, steps, warmup);
      }
      alone.push_back(times[0]);
      for (int c = 0; c < 4; ++c) ratios[c].push_back(times[c + 1] / times[0]);
    }
    const double limit = bench::median(alone);
    const double loading = static_cast<double>(batch_size) * cost;
    const double floor = std::max({limit, loading, (limit + loading) / 2});
    std::printf("| %lld | %.1f | %.2f | %.2f |", static_cast<long long>(batch_size), loading * 1e3, limit * 1e3,
                floor / limit);
    for (auto& ratio : ratios) std::printf(" %.2fx |", bench::median(ratio));
    std::printf("\n");
  }
  std::printf(
      "(x: time per step over M, the model-only time, the median of the rounds' ratios. With L ms of CPU loading per "
      "batch, 2 cores cannot "
      "take less than max(M, L, (L + M) / 2) per step: the floor. 'Other core busy': M while a thread does "
      "the loading's arithmetic on the other core, the most this machine gives a step beside a worker)\n");
}
