// fp8 against bf16: tokens per second of a decoder-only transformer's training step (forward, backward, AdamW), on
// CUDA when there is a device, else on the CPU. The model is sized for its matmuls to dominate on a GPU (the default
// on CUDA: width 4096, 4 blocks, 4 sequences of 2048 tokens: 8192 tokens a step); on the CPU the default is small,
// and what is measured is LibTorch's CPU float8 matmul, not a GPU's.
//
//   bench_fp8_step [--dim D] [--layers L] [--batch B] [--seq T] [--steps N] [--rounds R] [--cpu]
//                  [--optimizer adamw|multi_tensor_adamw] [--parts | --profile]
//
// Prints, per precision, the median over R rounds of N timed steps (after 3 warm-up steps), then fp8 / bf16. The
// optimizer is LibTorch's AdamW (one parameter at a time), or accel::multi_tensor_adamw. Instead of that:
// --parts times one converted layer's forward in parts (the casts, the float8 matmul, the bfloat16 one); --profile
// prints where a step's time goes, bf16's and fp8's, by kernel (on the CPU: by operator), from LibTorch's profiler.
#include <accel/accel.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

struct settings {
  int64_t dim = 0, layers = 0, batch = 0, seq = 0;
  int steps = 0, rounds = 3;
  bool cpu = false, parts = false, profile = false, multi_tensor = false;
};

// A pre-norm transformer block: attention (qkv and output projections) and a 4x MLP; every Linear converts.
struct block_impl : torch::nn::Module {
  block_impl(int64_t dim, int64_t head_count)
      : heads(head_count),
        norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        qkv(register_module("qkv", torch::nn::Linear(dim, 3 * dim))),
        out(register_module("out", torch::nn::Linear(dim, dim))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        up(register_module("up", torch::nn::Linear(dim, 4 * dim))),
        down(register_module("down", torch::nn::Linear(4 * dim, dim))) {}
  torch::Tensor forward(torch::Tensor x) {
    const auto b = x.size(0), t = x.size(1), d = x.size(2);
    const auto parts = qkv(norm1(x)).view({b, t, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
    const auto mixed = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], {}, 0.0, /*is_causal=*/true);
    x = x + out(mixed.transpose(1, 2).reshape({b, t, d}));
    return x + down(torch::gelu(up(norm2(x))));
  }
  int64_t heads;
  torch::nn::LayerNorm norm1;
  torch::nn::Linear qkv, out;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear up, down;
};
TORCH_MODULE_IMPL(block, block_impl);

// Embedding, blocks, a head of 512 tokens' logits: the head and the first qkv stay in bfloat16 (Accelerate's filter).
struct transformer_impl : torch::nn::Module {
  transformer_impl(int64_t dim, int64_t layers)
      : embedding(register_module("embedding", torch::nn::Embedding(512, dim))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        head(register_module("head", torch::nn::Linear(dim, 512))) {
    for (int64_t i = 0; i < layers; ++i) blocks->push_back(block(dim, dim / 128 > 0 ? dim / 128 : 1));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = embedding(tokens);
    for (const auto& b : *blocks) x = b->as<block>()->forward(x);
    return head(x);
  }
  torch::nn::Embedding embedding;
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
};
TORCH_MODULE_IMPL(transformer, transformer_impl);

void synchronise(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// The transformer of `s`'s size, the same weights every time.
transformer seeded_transformer(const settings& s) {
  torch::manual_seed(0);
  return transformer(s.dim, s.layers);
}

// The transformer prepared by an accelerator of type `Accelerator`, with fixed tokens and targets, and its step.
template <class Accelerator, class Optimizer>
struct training {
  explicit training(const settings& s)
      : acc(accel::options{.cpu = s.cpu}),
        net(seeded_transformer(s)),
        optimizer(net->parameters(), 1e-4),
        prepared(acc.prepare(net, optimizer)),
        tokens(torch::randint(512, {s.batch, s.seq}, torch::TensorOptions().dtype(torch::kLong)).to(acc.device())),
        targets(torch::randint(512, {s.batch * s.seq}, torch::TensorOptions().dtype(torch::kLong)).to(acc.device())) {}
  void step() {
    auto& [model, opt] = prepared;
    acc.backward(torch::nn::functional::cross_entropy(model(tokens).flatten(0, 1), targets));
    opt.step();
    opt.zero_grad();
  }
  Accelerator acc;
  transformer net;
  Optimizer optimizer;
  decltype(acc.prepare(net, optimizer)) prepared;
  torch::Tensor tokens, targets;
};

// The median milliseconds of `work` over `s.rounds` rounds of `s.steps` calls each (after one warm-up call).
template <class Work>
double milliseconds(const settings& s, const c10::Device& device, const Work& work) {
  work();
  std::vector<double> times;
  for (int round = 0; round < s.rounds; ++round) {
    synchronise(device);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < s.steps; ++i) work();
    synchronise(device);
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    times.push_back(took.count() / s.steps);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Tokens per second at the median round of `s.rounds` rounds of `s.steps` steps, after 3 warm-up steps.
template <class Accelerator, class Optimizer>
double tokens_per_second(const settings& s) {
  training<Accelerator, Optimizer> run(s);
  for (int i = 0; i < 2; ++i) run.step();  // and milliseconds' own warm-up call
  const double per_step = milliseconds(s, run.acc.device(), [&] { run.step(); });
  return static_cast<double>(s.batch * s.seq) * 1000.0 / per_step;
}

// What a profiled event's name is a part of: attention (checked first: cuDNN's attention kernels are named sm90_
// too), the matmuls (cuBLAS, cuBLASLt, CUTLASS kernels), the rest.
const char* kind_of(const std::string& name) {
  for (const char* attention : {"sdpa", "flash", "fmha", "attention", "efficient"})
    if (name.find(attention) != std::string::npos) return "attention";
  for (const char* matmul : {"gemm", "nvjet", "cutlass", "xmma", "sm90_", "addmm", "aten::mm", "_scaled_mm"})
    if (name.find(matmul) != std::string::npos) return "matmul";
  return "other";
}

// One step under LibTorch's profiler (Kineto): the time of the device's events by name, per step, largest first,
// and by kind. On CUDA the events are kernels; on the CPU operators, an outer one counting its inner ones again.
template <class Accelerator, class Optimizer>
void print_profile(const settings& s, const char* label) {
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  training<Accelerator, Optimizer> run(s);
  for (int i = 0; i < 3; ++i) run.step();
  synchronise(run.acc.device());
  const bool gpu = run.acc.device().is_cuda();
  const std::set<ActivityType> activities =
      gpu ? std::set{ActivityType::CPU, ActivityType::CUDA} : std::set{ActivityType::CPU};
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  const int steps = 2;
  for (int i = 0; i < steps; ++i) run.step();
  synchronise(run.acc.device());
  const auto result = profiler::disableProfiler();
  std::map<std::string, std::pair<double, int>> by_name;  // ms per step, calls in all the profiled steps
  std::map<std::string, double> by_kind;
  double total = 0;
  for (const auto& event : result->events()) {
    if (event.deviceType() != run.acc.device().type()) continue;
    const double ms = static_cast<double>(event.durationNs()) / 1e6 / steps;
    auto& [time, calls] = by_name[event.name()];
    time += ms;
    calls += 1;
    by_kind[kind_of(event.name())] += ms;
    total += ms;
  }
  std::vector<std::pair<double, std::string>> largest;
  for (const auto& [name, entry] : by_name) largest.emplace_back(entry.first, name);
  std::sort(largest.rbegin(), largest.rend());
  std::printf("%s, one step's %s time: %.2f ms (matmul %.2f, attention %.2f, other %.2f)\n", label,
              gpu ? "kernel" : "operator", total, by_kind["matmul"], by_kind["attention"], by_kind["other"]);
  for (std::size_t i = 0; i < std::min<std::size_t>(largest.size(), 24); ++i) {
    const auto& [ms, name] = largest[i];
    std::printf("  %9.3f ms %5d x  %.110s\n", ms, by_name[name].second / steps, name.c_str());
  }
}

// Where a converted layer's forward goes, at the MLP's up projection (tokens x width times width x 4 width): the
// bfloat16 matmul it replaces, the float8 casts of its input (bfloat16) and weight (float32 master), the float8
// matmul alone. fp8 gains where the casts cost less than the matmul saves.
void print_parts(const settings& s, const c10::Device& device) {
  namespace f = accel::detail::fp8;
  const auto x = torch::randn({s.batch * s.seq, s.dim}, torch::TensorOptions(device).dtype(torch::kBFloat16));
  const auto weight = torch::randn({4 * s.dim, s.dim}, torch::TensorOptions(device));
  const auto weight16 = weight.to(torch::kBFloat16);
  const auto casts = [&] {
    return std::pair{f::cast_dynamic(x, torch::kFloat8_e4m3fn, std::nullopt, false),
                     f::cast_dynamic(weight, torch::kFloat8_e4m3fn, std::nullopt, false)};
  };
  const auto [x8, w8] = casts();
  const bool emulate = device.is_cpu();  // as options::fp8.emulate chooses when unset
  const double matmul16 = milliseconds(s, device, [&] { (void)at::linear(x, weight16); });
  const double cast = milliseconds(s, device, [&] { (void)casts(); });
  // Where the cast kernel wrote both layouts: ATen's casts and transposes of the same operands, to compare with.
  const auto aten_cast = [](const torch::Tensor& t) {
    const auto scale = f::amax_to_scale(f::amax(t, std::nullopt), torch::kFloat8_e4m3fn, false);
    return f::cast_in_range(t, scale, torch::kFloat8_e4m3fn).t().contiguous();
  };
  const double aten_casts =
      x8.transposed.defined() ? milliseconds(s, device, [&] { (void)aten_cast(x), (void)aten_cast(weight); }) : 0.0;
  const double matmul8 =
      milliseconds(s, device, [&] { (void)f::scaled_mm(x8, w8.t(), torch::kBFloat16, true, true, emulate); });
  std::printf("parts of one layer's forward, %lld x %lld times %lld x %lld%s:\n", static_cast<long long>(x.size(0)),
              static_cast<long long>(s.dim), static_cast<long long>(s.dim), static_cast<long long>(4 * s.dim),
              emulate ? " (float8 matmul emulated)" : "");
  std::printf("  %-26s %10.3f ms\n", "bf16 matmul", matmul16);
  // On CUDA the casts write the backward's transposed layouts too (detail/fp8/cast_kernel.hpp), in the same pass.
  std::printf("  %-26s %10.3f ms\n", x8.transposed.defined() ? "fp8 casts, both layouts" : "fp8 casts (input, weight)",
              cast);
  if (x8.transposed.defined()) std::printf("  %-26s %10.3f ms\n", "ATen's casts + transposes", aten_casts);
  std::printf("  %-26s %10.3f ms\n", "fp8 matmul", matmul8);
  std::printf("  %-26s %10.3f ms  %.2fx bf16's time\n", "fp8 casts + matmul", cast + matmul8,
              (cast + matmul8) / matmul16);
}

// The benchmark proper (or, with --profile, the profiles) of bf16, fp8 tensorwise and fp8 delayed, with `Optimizer`.
template <class Optimizer>
void compare(const settings& s, bool gpu) {
  using bf16 = accel::accelerator<accel::bf16>;
  using tensorwise = accel::accelerator<accel::fp8<>>;
  if (s.profile) {
    print_profile<bf16, Optimizer>(s, "bf16");
    print_profile<tensorwise, Optimizer>(s, "fp8<tensorwise_scaling>");
    return;
  }
  std::printf("fp8 vs bf16 on %s: width %lld, %lld blocks, %lld x %lld tokens a step, %d steps x %d rounds, %s\n",
              gpu ? "CUDA" : "the CPU", static_cast<long long>(s.dim), static_cast<long long>(s.layers),
              static_cast<long long>(s.batch), static_cast<long long>(s.seq), s.steps, s.rounds,
              s.multi_tensor ? "accel::multi_tensor_adamw" : "LibTorch's AdamW");
  const double bf16_rate = tokens_per_second<bf16, Optimizer>(s);
  std::printf("bf16                     %12.0f tokens/s\n", bf16_rate);
  const double tensorwise_rate = tokens_per_second<tensorwise, Optimizer>(s);
  std::printf("fp8<tensorwise_scaling>  %12.0f tokens/s  %.2fx bf16\n", tensorwise_rate, tensorwise_rate / bf16_rate);
  const double delayed_rate = tokens_per_second<accel::accelerator<accel::fp8<accel::delayed_scaling>>, Optimizer>(s);
  std::printf("fp8<delayed_scaling>     %12.0f tokens/s  %.2fx bf16\n", delayed_rate, delayed_rate / bf16_rate);
}

bool parse(int argc, char** argv, settings& s) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto next = [&] { return i + 1 < argc ? std::stoll(argv[++i]) : -1; };
    if (flag == "--dim")
      s.dim = next();
    else if (flag == "--layers")
      s.layers = next();
    else if (flag == "--batch")
      s.batch = next();
    else if (flag == "--seq")
      s.seq = next();
    else if (flag == "--steps")
      s.steps = static_cast<int>(next());
    else if (flag == "--rounds")
      s.rounds = static_cast<int>(next());
    else if (flag == "--cpu")
      s.cpu = true;
    else if (flag == "--parts")
      s.parts = true;
    else if (flag == "--profile")
      s.profile = true;
    else if (flag == "--optimizer" && i + 1 < argc &&
             (argv[i + 1] == std::string("adamw") || argv[i + 1] == std::string("multi_tensor_adamw")))
      s.multi_tensor = argv[++i] == std::string("multi_tensor_adamw");
    else
      return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  if (!parse(argc, argv, s)) {
    std::fprintf(stderr,
                 "usage: bench_fp8_step [--dim D] [--layers L] [--batch B] [--seq T] [--steps N] "
                 "[--rounds R] [--cpu] [--optimizer adamw|multi_tensor_adamw] [--parts | --profile]\n");
    return 2;
  }
  const bool gpu = !s.cpu && torch::cuda::is_available();
  s.cpu = !gpu;
  // Defaults: a GPU-sized model where there is a GPU, a small one on the CPU (whose float8 matmul is slow).
  if (s.dim == 0) s.dim = gpu ? 4096 : 256;
  if (s.layers == 0) s.layers = gpu ? 4 : 2;
  if (s.batch == 0) s.batch = gpu ? 4 : 4;
  if (s.seq == 0) s.seq = gpu ? 2048 : 128;
  if (s.steps == 0) s.steps = gpu ? 20 : 3;
  if (s.parts) {
    print_parts(s, gpu ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU));
    return 0;
  }
  if (s.multi_tensor)
    compare<accel::multi_tensor_adamw>(s, gpu);
  else
    compare<torch::optim::AdamW>(s, gpu);
  return 0;
}
