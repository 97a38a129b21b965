// One job of bench/gpu_compare.py: a training step on one device, through accel or as the hand-written LibTorch loop
// (the step-overhead baseline), for the tiny MLP of support.hpp (64 -> 64 -> 64 -> 1, MSE) or the character
// transformer of examples/char_transformer.hpp (vocabulary 96, context 128, width 256, 4 heads, 4 layers, cross
// entropy); AdamW (LibTorch's, or accel::multi_tensor_adamw: the same update in multi-tensor operations, as Python's
// default on CUDA), fp32 or bf16 autocast, batches made once on the device and cycled. bench/gpu_step.py is the same
// job through Hugging Face Accelerate and as the plain PyTorch loop.
//   bench_gpu_step MODEL accel|raw|overhead cpu|cuda fp32|bf16 adamw|multi_tensor_adamw BATCH STEPS WARMUP ROUNDS
// Prints one line: `LOOP MODEL DEVICE PRECISION BATCH MS_PER_STEP TOKENS_PER_SECOND` (medians over the rounds; a
// token is a sample for the MLP). On CUDA each round ends with a synchronisation, so its time is the GPU's too.
// `overhead` runs both loops in one process, round by round, and prints accel's time over the hand-written loop's.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "char_transformer.hpp"
#include "support.hpp"

namespace {

constexpr int64_t vocabulary = 96, context = 128;

struct job {
  std::string model, loop, device, precision, optimizer;
  int64_t batch;
  int steps, warmup, rounds;
  [[nodiscard]] int64_t tokens_per_step() const { return model == "mlp" ? batch : batch * context; }
};

/// The transformer, the same weights every time.
CharTransformer transformer() {
  torch::manual_seed(0);
  return CharTransformer(vocabulary, context, /*dim=*/256, /*heads=*/4, /*layers=*/4, /*dropout=*/0.0);
}

/// 8 batches of inputs and targets on `device`, cycled by the loops.
std::vector<bench::batch> make_batches(const job& j, const c10::Device& device) {
  torch::manual_seed(1);
  std::vector<bench::batch> data;
  for (int i = 0; i < 8; ++i) {
    if (j.model == "mlp") {
      data.emplace_back(torch::randn({j.batch, bench::tiny_width}), torch::randn({j.batch, 1}));
    } else {
      const auto tokens = torch::randint(vocabulary, {j.batch, context + 1}, torch::kLong);
      data.emplace_back(tokens.narrow(1, 0, context).contiguous(), tokens.narrow(1, 1, context).contiguous());
    }
    data.back() = {data.back().first.to(device), data.back().second.to(device)};
  }
  return data;
}

torch::Tensor loss_of(const job& j, const torch::Tensor& output, const torch::Tensor& target) {
  if (j.model == "mlp") return torch::mse_loss(output, target);
  return torch::nn::functional::cross_entropy(output.flatten(0, 1), target.flatten());
}

/// A loop ready to run on its device: one training step on batch i. The step owns what it uses.
struct loop {
  c10::Device device;
  std::function<void(int)> step;
};

/// Seconds per step of one round of `j.steps` steps (on CUDA, the GPU's work included).
double seconds_per_step(const job& j, const loop& l) {
  if (l.device.is_cuda()) torch::cuda::synchronize();
  const auto start = bench::clock_type::now();
  for (int i = 0; i < j.steps; ++i) l.step(i);
  if (l.device.is_cuda()) torch::cuda::synchronize();
  return bench::seconds_since(start) / j.steps;
}

/// Milliseconds per step, the median over the rounds, after the warm-up steps.
double median_ms(const job& j, const loop& l) {
  for (int i = 0; i < j.warmup; ++i) l.step(i);
  std::vector<double> seconds;
  for (int r = 0; r < j.rounds; ++r) seconds.push_back(seconds_per_step(j, l));
  return bench::median(seconds) * 1e3;
}

/// accel's time over the hand-written loop's in one process: rounds alternate between the two (each going first
/// every other round), so that what disturbs the machine for a while disturbs both; the median of per-round ratios.
double overhead_ratio(const job& j, const loop& raw, const loop& accelerated) {
  for (int i = 0; i < j.warmup; ++i) {
    raw.step(i);
    accelerated.step(i);
  }
  std::vector<double> ratios;
  for (int r = 0; r < j.rounds; ++r) {
    const bool raw_first = r % 2 == 0;
    const double first = seconds_per_step(j, raw_first ? raw : accelerated);
    const double second = seconds_per_step(j, raw_first ? accelerated : raw);
    ratios.push_back(raw_first ? second / first : first / second);
  }
  return bench::median(ratios);
}

/// The hand-written loop: the model and batches on the device, autocast around the forward for bf16 (the calls a
/// LibTorch program makes by hand, as accel's scope does), the output back in float32, gradients set to none.
template <class Optimizer, class Net>
loop raw_loop(const job& j, Net net) {
  const c10::Device device(j.device == "cuda" ? c10::kCUDA : c10::kCPU);
  net->to(device);
  auto optimizer = std::make_shared<Optimizer>(net->parameters(), 1e-3);
  auto data = std::make_shared<const std::vector<bench::batch>>(make_batches(j, device));
  const bool bf16 = j.precision == "bf16";
  return {device, [=, &j](int i) mutable {
            const auto& [x, y] = (*data)[static_cast<std::size_t>(i) % data->size()];
            torch::Tensor output;
            if (bf16) {
              const accel::detail::autocast_scope scope(device.type(), torch::kBFloat16);
              output = net->forward(x);
            } else {
              output = net->forward(x);
            }
            loss_of(j, output.to(torch::kFloat), y).backward();
            optimizer->step();
            accel::detail::compat::zero_grad(*optimizer, /*set_to_none=*/true);
          }};
}

/// What the accel loop keeps alive: the accelerator, the optimizer and what prepare made of them.
template <class Precision, class Optimizer, class Net>
struct accel_setup {
  accel_setup(const job& j, Net net)
      : acc{{.cpu = j.device == "cpu"}}, optimizer(net->parameters(), 1e-3), prepared(acc.prepare(net, optimizer)) {}
  accel::accelerator<Precision> acc;
  Optimizer optimizer;
  decltype(acc.prepare(std::declval<Net&>(), std::declval<Optimizer&>())) prepared;
};

/// The same loop through accel::accelerator<Precision>.
template <class Precision, class Optimizer, class Net>
loop accel_loop(const job& j, Net net) {
  auto setup = std::make_shared<accel_setup<Precision, Optimizer, Net>>(j, net);
  auto data = std::make_shared<const std::vector<bench::batch>>(make_batches(j, setup->acc.device()));
  return {setup->acc.device(), [=, &j](int i) {
            auto& [model, opt] = setup->prepared;
            const auto& [x, y] = (*data)[static_cast<std::size_t>(i) % data->size()];
            setup->acc.backward(loss_of(j, model(x), y));
            opt.step();
            opt.zero_grad();
          }};
}

template <class Optimizer, class Net>
loop make_loop(const job& j, const std::string& which, Net net) {
  if (which == "raw") return raw_loop<Optimizer>(j, net);
  return j.precision == "bf16" ? accel_loop<accel::bf16, Optimizer>(j, net)
                               : accel_loop<accel::fp32, Optimizer>(j, net);
}

/// A fresh model of the job's kind, the same weights every time.
template <class Optimizer>
loop make_loop(const job& j, const std::string& which) {
  return j.model == "mlp" ? make_loop<Optimizer>(j, which, bench::tiny_mlp())
                          : make_loop<Optimizer>(j, which, transformer());
}

/// The job's line: `LOOP MODEL DEVICE PRECISION BATCH MS_PER_STEP TOKENS_PER_SECOND`, or for `overhead`
/// `overhead MODEL DEVICE PRECISION BATCH RATIO` (accel's time over the hand-written loop's, in one process).
template <class Optimizer>
void run(const job& j) {
  if (j.loop == "overhead") {
    const auto raw = make_loop<Optimizer>(j, "raw");
    const auto accelerated = make_loop<Optimizer>(j, "accel");
    std::printf("overhead %s %s %s %lld %.4f\n", j.model.c_str(), j.device.c_str(), j.precision.c_str(),
                static_cast<long long>(j.batch), overhead_ratio(j, raw, accelerated));
    return;
  }
  const double ms = median_ms(j, make_loop<Optimizer>(j, j.loop));
  std::printf("%s %s %s %s %lld %.4f %.1f\n", j.loop.c_str(), j.model.c_str(), j.device.c_str(), j.precision.c_str(),
              static_cast<long long>(j.batch), ms, static_cast<double>(j.tokens_per_step()) / (ms / 1e3));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(
        stderr,
        "usage: %s mlp|transformer accel|raw|overhead cpu|cuda fp32|bf16 adamw|multi_tensor_adamw BATCH STEPS WARMUP "
        "ROUNDS\n",
        argv[0]);
    return 2;
  }
  const job j{argv[1],
              argv[2],
              argv[3],
              argv[4],
              argv[5],
              std::atoll(argv[6]),
              std::atoi(argv[7]),
              std::atoi(argv[8]),
              std::atoi(argv[9])};
  if ((j.model != "mlp" && j.model != "transformer") ||
      (j.loop != "accel" && j.loop != "raw" && j.loop != "overhead") || (j.device != "cpu" && j.device != "cuda") ||
      (j.precision != "fp32" && j.precision != "bf16") ||
      (j.optimizer != "adamw" && j.optimizer != "multi_tensor_adamw") || j.batch < 1 || j.steps < 1 || j.rounds < 1) {
    std::fprintf(stderr, "%s: bad arguments\n", argv[0]);
    return 2;
  }
  if (j.device == "cuda" && !torch::cuda::is_available()) {
    std::printf("no CUDA device\n");
    return 77;
  }
  torch::set_num_threads(1);
  if (j.optimizer == "adamw") {
    run<torch::optim::AdamW>(j);
  } else {
    run<accel::multi_tensor_adamw>(j);
  }
}
