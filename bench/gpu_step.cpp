// One job of bench/gpu_compare.py: a training step on one device, through accel or as the hand-written LibTorch loop
// (the step-overhead baseline), for the tiny MLP of support.hpp (64 -> 64 -> 64 -> 1, MSE) or the character
// transformer of examples/char_transformer.hpp (vocabulary 96, context 128, width 256, 4 heads, 4 layers, cross
// entropy); AdamW (LibTorch's, or accel::multi_tensor_adamw: the same update in multi-tensor operations, as Python's
// default on CUDA), fp32 or bf16 autocast, batches made once on the device and cycled. bench/gpu_step.py is the same
// job through Hugging Face Accelerate and as the plain PyTorch loop.
//   bench_gpu_step mlp|transformer accel|raw cpu|cuda fp32|bf16 adamw|multi_tensor_adamw BATCH STEPS WARMUP ROUNDS
// Prints one line: `LOOP MODEL DEVICE PRECISION BATCH MS_PER_STEP TOKENS_PER_SECOND` (medians over the rounds; a
// token is a sample for the MLP). On CUDA each round ends with a synchronisation, so its time is the GPU's too.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>
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

/// Milliseconds per call of `step(i)`, the median over the rounds, after the warm-up steps.
template <class Step>
double median_ms(const job& j, const c10::Device& device, Step&& step) {
  auto synchronise = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  for (int i = 0; i < j.warmup; ++i) step(i);
  std::vector<double> seconds;
  for (int r = 0; r < j.rounds; ++r) {
    synchronise();
    const auto start = bench::clock_type::now();
    for (int i = 0; i < j.steps; ++i) step(i);
    synchronise();
    seconds.push_back(bench::seconds_since(start) / j.steps);
  }
  return bench::median(seconds) * 1e3;
}

/// The hand-written loop: the model and batches on the device, autocast around the forward for bf16 (the calls a
/// LibTorch program makes by hand, as accel's scope does), the output back in float32, gradients set to none.
template <class Optimizer, class Net>
double raw_loop(const job& j, Net net) {
  const c10::Device device(j.device == "cuda" ? c10::kCUDA : c10::kCPU);
  net->to(device);
  Optimizer optimizer(net->parameters(), 1e-3);
  const auto data = make_batches(j, device);
  const bool bf16 = j.precision == "bf16";
  return median_ms(j, device, [&](int i) {
    const auto& [x, y] = data[static_cast<std::size_t>(i) % data.size()];
    torch::Tensor output;
    if (bf16) {
      const accel::detail::autocast_scope scope(device.type(), torch::kBFloat16);
      output = net->forward(x);
    } else {
      output = net->forward(x);
    }
    loss_of(j, output.to(torch::kFloat), y).backward();
    optimizer.step();
    accel::detail::compat::zero_grad(optimizer, /*set_to_none=*/true);
  });
}

/// The same loop through accel::accelerator<Precision>.
template <class Precision, class Optimizer, class Net>
double accel_loop(const job& j, Net net) {
  accel::accelerator<Precision> acc{{.cpu = j.device == "cpu"}};
  Optimizer optimizer(net->parameters(), 1e-3);
  auto [model, opt] = acc.prepare(net, optimizer);
  const auto data = make_batches(j, acc.device());
  return median_ms(j, acc.device(), [&](int i) {
    const auto& [x, y] = data[static_cast<std::size_t>(i) % data.size()];
    acc.backward(loss_of(j, model(x), y));
    opt.step();
    opt.zero_grad();
  });
}

template <class Optimizer, class Net>
double milliseconds_per_step(const job& j, Net net) {
  if (j.loop == "raw") return raw_loop<Optimizer>(j, net);
  return j.precision == "bf16" ? accel_loop<accel::bf16, Optimizer>(j, net)
                               : accel_loop<accel::fp32, Optimizer>(j, net);
}

template <class Optimizer>
double milliseconds_per_step(const job& j) {
  return j.model == "mlp" ? milliseconds_per_step<Optimizer>(j, bench::tiny_mlp())
                          : milliseconds_per_step<Optimizer>(j, transformer());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr,
                 "usage: %s mlp|transformer accel|raw cpu|cuda fp32|bf16 adamw|multi_tensor_adamw BATCH STEPS WARMUP "
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
  if ((j.model != "mlp" && j.model != "transformer") || (j.loop != "accel" && j.loop != "raw") ||
      (j.device != "cpu" && j.device != "cuda") || (j.precision != "fp32" && j.precision != "bf16") ||
      (j.optimizer != "adamw" && j.optimizer != "multi_tensor_adamw") || j.batch < 1 || j.steps < 1 || j.rounds < 1) {
    std::fprintf(stderr, "%s: bad arguments\n", argv[0]);
    return 2;
  }
  if (j.device == "cuda" && !torch::cuda::is_available()) {
    std::printf("no CUDA device\n");
    return 77;
  }
  torch::set_num_threads(1);
  const double ms = j.optimizer == "adamw" ? milliseconds_per_step<torch::optim::AdamW>(j)
                                           : milliseconds_per_step<accel::multi_tensor_adamw>(j);
  std::printf("%s %s %s %s %lld %.4f %.1f\n", j.loop.c_str(), j.model.c_str(), j.device.c_str(), j.precision.c_str(),
              static_cast<long long>(j.batch), ms, static_cast<double>(j.tokens_per_step()) / (ms / 1e3));
}
