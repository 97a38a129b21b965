// Issue 33, item 1: accel::construct_sharded on P = 2 and 4 Gloo processes (tests/CMakeLists.txt,
// bigmodel.construct.*): a model built sliced against the same model built whole and sharded at prepare, bit for bit
// before and after training, and the CPU storage its construction held, counted.
// LibTorch first: c10's logging defines a CHECK of its own, which Catch's must replace (as the precompiled header of
// the other test binaries orders them).
#include <torch/torch.h>
// clang-format off
#include <catch2/catch.hpp>
// clang-format on

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

using zero3 = accel::fully_sharded<accel::gloo>;
constexpr int width = 97;  // 97 x 97 = 9409 elements: uneven slices at P = 2 and 4

/// A unit's module: two layers and a frozen scale (which stays whole: fully_sharded replicates frozen parameters).
struct block_impl : torch::nn::Module {
  block_impl() {
    l1 = register_module("l1", torch::nn::Linear(width, width));
    l2 = register_module("l2", torch::nn::Linear(width, width));
    scale = register_parameter("scale", torch::full({width}, 0.5), /*requires_grad=*/false);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(l2(torch::tanh(l1(x)))) * scale + x; }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE_IMPL(block, block_impl);

/// A stem and a head outside any unit, `units` shard units of `block` between them.
struct tower_impl : torch::nn::Module {
  explicit tower_impl(int units) {
    stem = register_module("stem", torch::nn::Linear(13, width));
    for (int i = 0; i < units; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), accel::shard_unit(block())));
    head = register_module("head", torch::nn::Linear(width, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = stem(x);
    for (auto& b : blocks) x = b(x);
    return head(x);
  }
  torch::nn::Linear stem{nullptr}, head{nullptr};
  std::vector<accel::shard_unit<block>> blocks;
};
TORCH_MODULE_IMPL(tower, tower_impl);

constexpr int units = 5;
const c10::Device cpu(c10::kCPU);

std::int64_t bytes_of(const std::vector<torch::Tensor>& tensors) {
  std::int64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.numel() * static_cast<std::int64_t>(t.element_size());
  return bytes;
}

/// What a sliced construction may hold, by the formula of docs/big-models.md: this process's slices of the units'
/// trainable parameters, their frozen ones whole, the parameters outside units whole; and the largest unit's
/// trainable parameters whole on top while it is sliced.
struct construction_bytes {
  std::int64_t held = 0;
  std::int64_t largest_unit = 0;
};
construction_bytes expected_bytes(tower& net, int rank, int world) {
  construction_bytes expected;
  for (const auto& p : net->stem->parameters()) expected.held += p.numel() * 4;
  for (const auto& p : net->head->parameters()) expected.held += p.numel() * 4;
  for (auto& b : net->blocks) {
    std::int64_t whole = 0;
    for (const auto& p : b->parameters()) {
      if (!p.requires_grad()) {
        expected.held += p.numel() * 4;
        continue;
      }
      expected.held += accel::detail::shard_span_of(p.numel(), rank, world).length * 4;
      whole += p.numel() * 4;
    }
    expected.largest_unit = std::max(expected.largest_unit, whole);
  }
  return expected;
}

template <class Accelerator, class Model, class Optimizer>
void train(Accelerator& acc, Model& model, Optimizer& opt, int steps) {
  torch::manual_seed(40 + acc.process_index());
  for (int step = 0; step < steps; ++step) {
    acc.backward(model(torch::randn({6, 13})).pow(2).mean());
    opt.step();
    opt.zero_grad();
  }
}

void check_same_parameters(tower& a, tower& b) {
  const auto named_a = a->named_parameters(), named_b = b->named_parameters();
  REQUIRE(named_a.size() == named_b.size());
  for (std::size_t i = 0; i < named_a.size(); ++i) {
    INFO(named_a[i].key());
    CHECK(named_a[i].key() == named_b[i].key());
    CHECK(torch::equal(named_a[i].value(), named_b[i].value()));
  }
}

/// `whole` and `sliced` prepared with AdamW under `acc` and trained 3 steps each: this process's slices bit for bit
/// alike at rest, before and after, and the full weights (get_state_dict) alike after.
template <class Accelerator>
void check_trained_alike(Accelerator& acc, tower& whole, tower& sliced) {
  torch::optim::AdamW whole_adamw(whole->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW sliced_adamw(sliced->parameters(), torch::optim::AdamWOptions(1e-2));
  auto [whole_model, whole_opt] = acc.prepare(whole, whole_adamw);
  auto [sliced_model, sliced_opt] = acc.prepare(sliced, sliced_adamw);
  check_same_parameters(whole, sliced);  // at rest: this process's slices of each
  train(acc, whole_model, whole_opt, 3);
  train(acc, sliced_model, sliced_opt, 3);
  check_same_parameters(whole, sliced);
  const auto full_whole = acc.get_state_dict(whole_model), full_sliced = acc.get_state_dict(sliced_model);
  REQUIRE(full_whole.size() == full_sliced.size());
  for (std::size_t i = 0; i < full_whole.size(); ++i) CHECK(torch::equal(full_whole[i].second, full_sliced[i].second));
}

}  // namespace

TEST_CASE(
    "construct_sharded: each unit keeps this process's slices as it is built (CPU storage counted: at most the "
    "slices, one unit whole and the parameters outside units); the prepared parameters are bit for bit those of the "
    "model built whole and sharded at prepare, before and after 3 AdamW steps",
    "[bigmodel_construct]") {
  accel::count_cpu_memory();
  accel::accelerator<accel::fp32, zero3> acc;
  const int P = acc.num_processes(), r = acc.process_index();

  accel::reset_peak_memory_stats(cpu);
  auto before = accel::memory_stats(cpu).allocated;
  accel::set_seed(21);
  tower whole(units);
  const auto whole_bytes = bytes_of(whole->parameters());
  CHECK(accel::memory_stats(cpu).peak_allocated - before >= whole_bytes);

  accel::set_seed(21);
  accel::reset_peak_memory_stats(cpu);
  before = accel::memory_stats(cpu).allocated;
  tower sliced = accel::construct_sharded(acc, [] { return tower(units); });
  const auto held = accel::memory_stats(cpu).allocated - before;
  const auto peak = accel::memory_stats(cpu).peak_allocated - before;
  const auto expected = expected_bytes(sliced, r, P);
  INFO("process " << r << " of " << P << ": held " << held << " B, peak " << peak << " B; the whole model "
                  << whole_bytes << " B, one unit " << expected.largest_unit << " B");
  // Beyond the formula, only what construct_sharded's all-gather of the generators' digests may leave for a moment:
  // Gloo's thread lets go of the gather's tensors (8 bytes a process, and this process's 8) after the wait returns.
  const std::int64_t digests = 8 * (P + 1);
  CHECK(held >= expected.held);
  CHECK(held <= expected.held + digests);
  CHECK(peak <= expected.held + expected.largest_unit + digests);
  CHECK(peak < whole_bytes);
  for (int u = 0; u < units; ++u) {  // the full shape, no bytes, until prepare
    const auto mine = sliced->blocks[u]->parameters(), reference = whole->blocks[u]->parameters();
    for (std::size_t i = 0; i < mine.size(); ++i) {
      CHECK(mine[i].sizes() == reference[i].sizes());
      CHECK(mine[i].storage().nbytes() == (mine[i].requires_grad() ? 0 : reference[i].storage().nbytes()));
    }
  }

  check_trained_alike(acc, whole, sliced);
}

TEST_CASE(
    "construct_sharded: a per-unit initialiser runs on each unit before it is sliced, as on the whole model's units; "
    "a forward before the optimizer is prepared, and processes seeded apart, are refused naming the fix",
    "[bigmodel_construct]") {
  accel::accelerator<accel::fp32, zero3> acc;
  const int r = acc.process_index();
  // An initialiser that needs whole parameters (a ramp over each one's elements): it could not run on slices.
  const auto ramp = [](torch::nn::Module& module) {
    torch::NoGradGuard no_grad;
    for (auto& p : module.parameters())
      if (p.requires_grad()) p.copy_(torch::linspace(-1, 1, p.numel()).view_as(p) / static_cast<double>(p.size(0)));
  };
  accel::set_seed(3);
  tower whole(units);
  for (auto& b : whole->blocks) ramp(*b);
  accel::set_seed(3);
  tower sliced = accel::construct_sharded(acc, [] { return tower(units); }, ramp);
  torch::optim::SGD whole_sgd(whole->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD sliced_sgd(sliced->parameters(), torch::optim::SGDOptions(0.1));
  auto [whole_model, whole_opt] = acc.prepare(whole, whole_sgd);
  auto [sliced_model, sliced_opt] = acc.prepare(sliced, sliced_sgd);
  check_same_parameters(whole, sliced);
  train(acc, whole_model, whole_opt, 2);
  train(acc, sliced_model, sliced_opt, 2);
  check_same_parameters(whole, sliced);

  accel::set_seed(4);
  tower lonely = accel::construct_sharded(acc, [] { return tower(units); });
  auto model_alone = acc.prepare(lonely);
  CHECK_THROWS_WITH(model_alone(torch::randn({2, 13})),
                    Catch::Contains("built by accel::construct_sharded") &&
                        Catch::Contains("acc.prepare(model, optimizer), before the first forward"));

  if (acc.num_processes() > 1) {
    accel::set_seed(5 + static_cast<std::uint64_t>(r == 1));
    CHECK_THROWS_WITH(accel::construct_sharded(acc, [] { return tower(units); }),
                      Catch::Contains("process 1's random generator differs from process 0's") &&
                          Catch::Contains("accel::set_seed(seed), without device_specific"));
  }
}

TEST_CASE(
    "construct_sharded under hybrid_sharded (dp_replicate 2 x dp_shard 2): each unit keeps this process's dp_shard "
    "slice, the same in both replicas; the prepared parameters are bit for bit those of the model built whole, "
    "before and after 3 AdamW steps",
    "[bigmodel_construct_hybrid]") {
  accel::count_cpu_memory();
  accel::accelerator<accel::fp32, accel::hybrid_sharded<accel::gloo>> acc;
  const auto [index, count] = acc.parallel().construction_slice();
  CHECK(count == acc.parallel().mesh().layout().size("dp_shard"));
  CHECK(index == acc.parallel().mesh().local_rank("dp_shard"));
  accel::set_seed(21);
  tower whole(units);
  accel::set_seed(21);
  accel::reset_peak_memory_stats(cpu);
  const auto before = accel::memory_stats(cpu).allocated;
  tower sliced = accel::construct_sharded(acc, [] { return tower(units); });
  const auto held = accel::memory_stats(cpu).allocated - before;
  const auto expected = expected_bytes(sliced, index, count);
  CHECK(held >= expected.held);
  CHECK(held <= expected.held + 8 * (acc.num_processes() + 1));  // and the generators' digests, for a moment
  check_trained_alike(acc, whole, sliced);
}
