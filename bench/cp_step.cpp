// One job of the context-parallel benchmark (bench/cp_compare.py runs it under `accel launch
// --parallelism_config_cp_size P`, or alone for cp = 1): one thread per process, Gloo.
//   bench_cp_step attention LENGTH STEPS WARMUP ROTATION  one causal attention, 2 heads of 32, over LENGTH tokens:
//                                                         forward and backward
//   bench_cp_step model LENGTH STEPS WARMUP ROTATION      char_lm's transformer (dim 64, 4 heads, 2 blocks, context
//                                                         LENGTH), batch 1, an SGD step
//   bench_cp_step overlap LENGTH STEPS WARMUP alltoall    the attention's forward with the ring's exchanges, its
//                                                         computation alone (each part passed to itself), and the
//                                                         exchanges alone
// Process 0 prints one line: `what cp length rotation tokens_per_s peak_bytes_per_process` (overlap: `overlap cp
// length alltoall ms_total ms_compute ms_exchanges hidden_fraction`). The peak is the counting allocator's, over the
// measured steps, above what was allocated before them.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "char_transformer.hpp"
#include "support.hpp"

namespace {

using cp_accelerator = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;

accel::cp_comm_strategy rotation_named(const std::string& name) {
  return name == "alltoall" ? accel::cp_comm_strategy::alltoall : accel::cp_comm_strategy::allgather;
}

/// Runs `step` `warmup` times, then `steps` times under the clock and the allocator's peak; returns seconds per step
/// and the peak above what was allocated before.
std::pair<double, std::int64_t> measure(int steps, int warmup, const std::function<void()>& step) {
  for (int i = 0; i < warmup; ++i) step();
  const c10::Device cpu(c10::kCPU);
  accel::reset_peak_memory_stats(cpu);
  const auto before = accel::memory_stats(cpu).allocated;
  const auto start = bench::clock_type::now();
  for (int i = 0; i < steps; ++i) step();
  return {bench::seconds_since(start) / steps, accel::memory_stats(cpu).peak_allocated - before};
}

int attention(cp_accelerator& acc, std::int64_t length, int steps, int warmup, const std::string& rotation) {
  torch::manual_seed(0);
  const auto make = [&] { return torch::randn({1, 2, length, 32}); };
  auto q = make(), k = make(), v = make();
  auto scope = accel::maybe_context_parallel(acc, {q, k, v}, {2, 2, 2}, {q, k, v});
  q.requires_grad_(true), k.requires_grad_(true), v.requires_grad_(true);
  const auto [seconds, peak] = measure(steps, warmup, [&] {
    accel::scaled_dot_product_attention(q, k, v, {.is_causal = true}).sum().backward();
    q.mutable_grad().reset(), k.mutable_grad().reset(), v.mutable_grad().reset();
  });
  if (acc.is_main_process())
    std::printf("attention %d %lld %s %.1f %lld\n", acc.num_processes(), static_cast<long long>(length),
                rotation.c_str(), static_cast<double>(length) / seconds, static_cast<long long>(peak));
  return 0;
}

int model(cp_accelerator& acc, std::int64_t length, int steps, int warmup, const std::string& rotation) {
  torch::manual_seed(0);
  auto net = CharTransformer(65, length, 64, 4, 2, 0.0);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
  auto [prepared, opt] = acc.prepare(net, optimizer);
  const auto tokens = torch::randint(65, {1, length}), targets = torch::randint(65, {1, length});
  const auto [seconds, peak] = measure(steps, warmup, [&] {
    auto x = tokens.clone(), y = targets.clone(), positions = torch::arange(length);
    auto scope = accel::maybe_context_parallel(acc, {x, y, positions}, {1, 1, 0});
    acc.backward(torch::nn::functional::cross_entropy(prepared(x, positions).reshape({-1, 65}), y.reshape({-1})));
    opt.step();
    opt.zero_grad();
  });
  if (acc.is_main_process())
    std::printf("model %d %lld %s %.1f %lld\n", acc.num_processes(), static_cast<long long>(length), rotation.c_str(),
                static_cast<double>(length) / seconds, static_cast<long long>(peak));
  return 0;
}

/// The ring's forward three ways: as it runs, its computation alone, its exchanges alone.
int overlap(cp_accelerator& acc, std::int64_t length, int steps, int warmup) {
  torch::manual_seed(0);
  const auto make = [&] { return torch::randn({1, 2, length, 32}); };
  auto q = make(), k = make(), v = make();
  auto scope = accel::maybe_context_parallel(acc, {q, k, v}, {2, 2, 2}, {q, k, v});
  auto* group = accel::detail::cp::current_scope()->group;
  const accel::detail::cp::mask_rule rule{true, {}, {}};
  const accel::detail::cp::sequence_split split{group->size, true};
  accel::detail::cp::ring alone = *group;  // the same parts, each passed to itself: the computation alone
  alone.exchange = [](at::Tensor& send, at::Tensor& receive) {
    receive.copy_(send);
    return std::function<void()>([] {});
  };
  const auto forward = [&](accel::detail::cp::ring* ring) {
    at::NoGradGuard no_grad;
    const accel::detail::cp::attention_plan plan{ring, split, accel::cp_comm_strategy::alltoall, 1.0 / std::sqrt(32.0)};
    (void)accel::detail::cp::ring_attention::apply(q, k, v, plan, rule);
  };
  const auto total = measure(steps, warmup, [&] { forward(group); }).first;
  const auto compute = measure(steps, warmup, [&] { forward(&alone); }).first;
  auto parts = at::stack({k, v}).contiguous();
  const auto exchanges = measure(steps, warmup, [&] {
                           for (int i = 0; i + 1 < group->size; ++i) {
                             auto next = at::empty_like(parts);
                             group->exchange(parts, next)();
                             parts = next;
                           }
                         }).first;
  if (acc.is_main_process())
    std::printf("overlap %d %lld alltoall %.3f %.3f %.3f %.3f\n", acc.num_processes(), static_cast<long long>(length),
                total * 1e3, compute * 1e3, exchanges * 1e3, (compute + exchanges - total) / exchanges);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: bench_cp_step attention|model|overlap LENGTH STEPS WARMUP allgather|alltoall\n");
    return 2;
  }
  const std::string what = argv[1], rotation = argv[5];
  const std::int64_t length = std::atoll(argv[2]);
  const int steps = std::atoi(argv[3]), warmup = std::atoi(argv[4]);
  torch::set_num_threads(1);
  accel::count_cpu_memory();
  accel::options opts;
  opts.parallelism_config.cp_comm_strategy = rotation_named(rotation);
  cp_accelerator acc(opts);
  if (what == "attention") return attention(acc, length, steps, warmup, rotation);
  if (what == "model") return model(acc, length, steps, warmup, rotation);
  if (what == "overlap") return acc.num_processes() > 1 ? overlap(acc, length, steps, warmup) : 0;
  std::fprintf(stderr, "bench_cp_step: unknown benchmark '%s'\n", what.c_str());
  return 2;
}
