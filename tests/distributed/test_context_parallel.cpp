// Context parallelism (accel/context_parallel.hpp) on real Gloo processes, as `accel launch
// --parallelism_config_cp_size P` starts them (cp.* in tests/CMakeLists.txt), and on one process: ring attention's
// outputs and gradients against full attention computed in one process in float64, for every mask accel can split
// and both rotations; packed documents kept apart; the collectives counted; refusals.
// LibTorch first: its logging header defines a CHECK of its own, which Catch's must replace (accel_tests' precompiled
// header includes them in this order too).
#include "support.hpp"

#include <catch2/catch.hpp>

#include "char_transformer_training.hpp"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace cp_test {

using cp_accelerator = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;

/// The job's processes all form the cp group (launched with --parallelism_config_cp_size = the processes).
accel::options cp_options(accel::cp_comm_strategy rotation) {
  accel::options opts;
  opts.parallelism_config.cp_comm_strategy = rotation;
  return opts;
}

enum class masking { none, causal, padded, documents, cumulative_lengths };

const char* name_of(masking kind) {
  switch (kind) {
    case masking::none:
      return "no mask";
    case masking::causal:
      return "causal";
    case masking::padded:
      return "causal and padded";
    case masking::documents:
      return "packed documents (ids)";
    case masking::cumulative_lengths:
      return "packed documents (cumulative lengths)";
  }
  return "";
}

constexpr std::int64_t batch = 2, heads = 2, head_dim = 8;

/// Three documents of unequal lengths packed into `length` positions (boundaries not on the parts' edges).
torch::Tensor boundaries(std::int64_t length) {
  return torch::tensor({std::int64_t{0}, length / 3 + 1, 2 * length / 3 + 1, length});
}

accel::attention_mask mask_of(masking kind, std::int64_t length) {
  accel::attention_mask mask;
  mask.is_causal = kind != masking::none;
  if (kind == masking::padded) {  // the second sequence ends 5 positions early
    mask.key_padding = torch::ones({batch, length}, torch::kBool);
    mask.key_padding[1].narrow(0, length - 5, 5).fill_(false);
  }
  const auto bounds = boundaries(length);
  if (kind == masking::documents)
    mask.document_ids = torch::searchsorted(bounds, torch::arange(length), false, true) - 1;
  if (kind == masking::cumulative_lengths) mask.cumulative_lengths = bounds;
  return mask;
}

/// Full attention in one process, float64, written out: the reference.
torch::Tensor full_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, masking kind) {
  const auto length = q.size(2);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
  const auto positions = torch::arange(length);
  auto allowed = torch::ones({batch, 1, length, length}, torch::kBool);
  if (kind != masking::none) allowed &= positions.unsqueeze(1).ge(positions.unsqueeze(0)).view({1, 1, length, length});
  if (kind == masking::padded) allowed &= mask_of(kind, length).key_padding.view({batch, 1, 1, length});
  if (kind == masking::documents || kind == masking::cumulative_lengths) {
    const auto ids = torch::searchsorted(boundaries(length), positions, false, true) - 1;
    allowed &= ids.unsqueeze(1).eq(ids.unsqueeze(0)).view({1, 1, length, length});
  }
  return torch::matmul(torch::softmax(scores.masked_fill(allowed.logical_not(), -INFINITY), -1), v);
}

/// The largest difference relative to the largest magnitude of the reference.
double relative_error(const torch::Tensor& got, const torch::Tensor& expected) {
  return (got.to(torch::kDouble) - expected).abs().max().item<double>() / expected.abs().max().item<double>();
}

struct attention_result {
  torch::Tensor output, grad_q, grad_k, grad_v;  // this process's part
};

/// q, k, v and the output's weights of the whole sequence (the same on every process), and a loss of the output.
struct attention_inputs {
  torch::Tensor q, k, v, weights;
  explicit attention_inputs(std::int64_t length, std::uint64_t seed = 11) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    q = torch::randn({batch, heads, length, head_dim}, generator, torch::kDouble);
    k = torch::randn({batch, heads, length, head_dim}, generator, torch::kDouble);
    v = torch::randn({batch, heads, length, head_dim}, generator, torch::kDouble);
    weights = torch::randn({batch, heads, length, head_dim}, generator, torch::kDouble);
  }
};

/// accel's attention of this process's part (inside maybe_context_parallel's scope), in `dtype`.
attention_result context_parallel_attention(cp_accelerator& acc, const attention_inputs& in, masking kind,
                                            torch::Dtype dtype) {
  auto q = in.q.to(dtype), k = in.k.to(dtype), v = in.v.to(dtype), weights = in.weights.to(dtype);
  const auto length = in.q.size(2);
  auto scope = accel::maybe_context_parallel(acc, {q, k, v, weights}, {2, 2, 2, 2}, {q, k, v, weights});
  q.requires_grad_(true);
  k.requires_grad_(true);
  v.requires_grad_(true);
  auto output = accel::scaled_dot_product_attention(q, k, v, mask_of(kind, length));
  (output.to(torch::kDouble) * weights.to(torch::kDouble)).sum().backward();
  return {output.detach(), q.grad(), k.grad(), v.grad()};
}

/// This process's part of a whole-sequence tensor, as the scope cuts it.
torch::Tensor part_of(const cp_accelerator& acc, const torch::Tensor& whole) {
  const int parts = acc.parallelism_config() ? acc.parallelism_config()->sizes().cp : 1;
  const int rank = acc.parallelism_config() ? acc.context_parallel_rank() : 0;
  return accel::detail::cp::sequence_split{parts, true}.shard(whole, 2, rank, "reference");
}

TEST_CASE("ring attention equals full attention, outputs and gradients, for every mask it can split",
          "[cp][cp_attention]") {
  for (const auto rotation : {accel::cp_comm_strategy::allgather, accel::cp_comm_strategy::alltoall}) {
    cp_accelerator acc(cp_options(rotation));
    const int parts = acc.num_processes();
    const std::int64_t length = 2 * parts * 3;  // three positions per chunk
    const attention_inputs in(length);
    for (const auto kind :
         {masking::none, masking::causal, masking::padded, masking::documents, masking::cumulative_lengths}) {
      INFO(name_of(kind) << ", rotation " << (rotation == accel::cp_comm_strategy::allgather ? "allgather" : "alltoall")
                         << ", cp = " << parts);
      auto q = in.q.clone().requires_grad_(true), k = in.k.clone().requires_grad_(true),
           v = in.v.clone().requires_grad_(true);
      const auto expected = full_attention(q, k, v, kind);
      (expected * in.weights).sum().backward();

      const auto got = context_parallel_attention(acc, in, kind, torch::kFloat);
      CHECK(relative_error(got.output, part_of(acc, expected.detach())) < 2e-6);
      CHECK(relative_error(got.grad_q, part_of(acc, q.grad())) < 2e-6);
      CHECK(relative_error(got.grad_k, part_of(acc, k.grad())) < 2e-6);
      CHECK(relative_error(got.grad_v, part_of(acc, v.grad())) < 2e-6);

      // bfloat16 (computed in float32 inside, as PyTorch's kernels do), against full attention of the same
      // bfloat16 inputs in float64: within PyTorch's CP tests' tolerance, 1e-3 x P absolute and relative, or within
      // one bfloat16 ulp of the exact value (rounding to bfloat16 alone moves a value by up to half an ulp, 2^-8 of
      // it, beyond 1e-3 x 2). One process computes in bfloat16 throughout (LibTorch's own operations): nothing to
      // compare there.
      if (parts == 1) continue;
      const auto low = context_parallel_attention(acc, in, kind, torch::kBFloat16);
      const auto rounded = [](const torch::Tensor& x) {
        return x.to(torch::kBFloat16).to(torch::kDouble).requires_grad_(true);
      };
      auto q1 = rounded(in.q), k1 = rounded(in.k), v1 = rounded(in.v);
      const auto alone = full_attention(q1, k1, v1, kind);
      (alone * in.weights.to(torch::kBFloat16).to(torch::kDouble)).sum().backward();
      const double tolerance = 1e-3 * parts;
      const auto close = [&](const torch::Tensor& part, const torch::Tensor& whole) {
        const auto exact = part_of(acc, whole);
        const auto error = (part.to(torch::kDouble) - exact).abs();
        return (error <= tolerance * (1 + exact.abs()))
            .logical_or(error <= exact.abs() * std::ldexp(1.0, -7))
            .all()
            .item<bool>();
      };
      CHECK(close(low.output, alone.detach()));
      CHECK(close(low.grad_q, q1.grad()));
      CHECK(close(low.grad_k, k1.grad()));
      CHECK(close(low.grad_v, v1.grad()));
    }
  }
}

TEST_CASE("ring attention counts its collectives: all-gather 1 forward, 1 + 1 backward; alltoall P - 1 and P",
          "[cp][cp_attention]") {
  for (const auto rotation : {accel::cp_comm_strategy::allgather, accel::cp_comm_strategy::alltoall}) {
    cp_accelerator acc(cp_options(rotation));
    const std::int64_t parts = acc.num_processes();
    const attention_inputs in(2 * parts * 2);
    auto q = in.q.to(torch::kFloat), k = in.k.to(torch::kFloat), v = in.v.to(torch::kFloat);
    auto scope = accel::maybe_context_parallel(acc, {q, k, v}, {2, 2, 2});
    const auto before = scope.counts();
    q.requires_grad_(true);
    accel::scaled_dot_product_attention(q, k, v, {.is_causal = true}).sum().backward();
    const auto after = scope.counts();
    const bool gathers = rotation == accel::cp_comm_strategy::allgather && parts > 1;
    const bool exchanges = rotation == accel::cp_comm_strategy::alltoall && parts > 1;
    CHECK(after.forward_all_gathers - before.forward_all_gathers == (gathers ? 1 : 0));
    CHECK(after.backward_all_gathers - before.backward_all_gathers == (gathers ? 1 : 0));
    CHECK(after.backward_reduce_scatters - before.backward_reduce_scatters == (gathers ? 1 : 0));
    CHECK(after.forward_exchanges - before.forward_exchanges == (exchanges ? parts - 1 : 0));
    CHECK(after.backward_exchanges - before.backward_exchanges == (exchanges ? parts : 0));
  }
}

TEST_CASE("packed documents stay apart under context parallelism: perturbing one moves no other",
          "[cp][cp_attention]") {
  cp_accelerator acc(cp_options(accel::cp_comm_strategy::allgather));
  const std::int64_t length = 2 * acc.num_processes() * 3;
  const auto ids = torch::searchsorted(boundaries(length), torch::arange(length), false, true) - 1;
  const attention_inputs in(length);
  attention_inputs perturbed(length);
  perturbed.q = in.q.clone(), perturbed.k = in.k.clone(), perturbed.v = in.v.clone();
  const auto second = ids.eq(1).view({1, 1, length, 1});  // the middle document
  perturbed.q += second * 0.5, perturbed.k -= second * 0.7, perturbed.v += second * 1.3;
  const auto others = part_of(acc, ids.ne(1).view({1, 1, length, 1}).expand({batch, heads, length, head_dim}));
  const auto moved = [&](masking kind) {
    auto q = in.q.to(torch::kFloat), k = in.k.to(torch::kFloat), v = in.v.to(torch::kFloat);
    auto pq = perturbed.q.to(torch::kFloat), pk = perturbed.k.to(torch::kFloat), pv = perturbed.v.to(torch::kFloat);
    auto scope = accel::maybe_context_parallel(acc, {q, k, v, pq, pk, pv}, {2, 2, 2, 2, 2, 2});
    const auto a = accel::scaled_dot_product_attention(q, k, v, mask_of(kind, length));
    const auto b = accel::scaled_dot_product_attention(pq, pk, pv, mask_of(kind, length));
    return std::pair{a.ne(b).logical_and(others).any().item<bool>(),
                     a.ne(b).logical_and(others.logical_not()).any().item<bool>()};
  };
  // Whether any process saw it (the perturbed document may lie on some processes only).
  const auto on_any_process = [&](bool seen) {
    return acc.reduce(torch::tensor({seen ? 1.0 : 0.0}), accel::reduction::sum).item<double>() > 0;
  };
  const auto [others_moved, own_moved] = moved(masking::documents);
  CHECK_FALSE(on_any_process(others_moved));
  CHECK(on_any_process(own_moved));
  // The check fails where the per-document mask is dropped (causal alone): the perturbation then reaches the
  // document after it.
  const auto [others_moved_causal, own_moved_causal] = moved(masking::causal);
  CHECK(on_any_process(own_moved_causal));
  CHECK(on_any_process(others_moved_causal));
}

TEST_CASE("context parallelism refuses what it cannot split, naming the fix", "[cp][cp_attention]") {
  cp_accelerator acc(cp_options(accel::cp_comm_strategy::allgather));
  const std::int64_t parts = acc.num_processes();
  if (parts == 1) return;  // nothing is split on one process
  auto odd = torch::randn({1, 1, 2 * parts * 2 + 1, 4});
  REQUIRE_THROWS_WITH(accel::maybe_context_parallel(acc, {odd}, {2}),
                      Catch::Contains("pad the sequences to " + std::to_string(2 * parts * 3)));
  CHECK(odd.size(2) == 2 * parts * 2 + 1);  // untouched
  auto q = torch::randn({1, 1, 2 * parts * 2, 4}), k = q.clone(), v = q.clone();
  REQUIRE_THROWS_WITH(accel::maybe_context_parallel(acc, {q, k}, {2}),
                      Catch::Contains("give one dimension per buffer"));
  {
    auto scope = accel::maybe_context_parallel(acc, {q, k, v}, {2, 2, 2});
    CHECK(q.size(2) == 4);
    accel::attention_mask bias;
    bias.bias = torch::zeros({4 * parts, 4 * parts});
    REQUIRE_THROWS_WITH(accel::scaled_dot_product_attention(q, k, v, bias),
                        Catch::Contains("cannot be split along the sequence"));
    accel::attention_mask local_padding;
    local_padding.key_padding = torch::ones({1, 4}, torch::kBool);
    REQUIRE_THROWS_WITH(accel::scaled_dot_product_attention(q, k, v, local_padding),
                        Catch::Contains("leave it out of maybe_context_parallel's buffers"));
  }
  CHECK(q.size(2) == 4 * parts);  // whole again
}

/// Where the jobs of one CTest fixture leave what the next reads (tests/CMakeLists.txt sets it).
std::filesystem::path cross_job_directory() {
  const char* dir = std::getenv("ACCEL_TEST_CROSS_JOB_DIR");
  REQUIRE(dir != nullptr);
  return dir;
}

/// Each tensor of a state dict (in the model's order) within 1e-5 of the reference's.
template <class StateDict>
void check_within_1e5(const StateDict& got, const std::vector<torch::Tensor>& expected) {
  std::size_t i = 0;
  for (const auto& [name, tensor] : got) {
    REQUIRE(i < expected.size());
    const auto difference = (tensor - expected[i++]).abs().max().template item<double>();
    INFO(name << ": max difference " << difference);
    CHECK(difference <= 1e-5);
  }
  CHECK(i == expected.size());
}

using accel_test::char_transformer;
using accel_test::char_transformer_plan;
using accel_test::characters;
using accel_test::transformer_sgd;
using accel_test::transformer_steps;
/// One process on the `dp` ranks' batches together: the reference.
std::vector<torch::Tensor> train_alone(int dp) { return accel_test::train_char_transformer_alone(dp); }

TEST_CASE("char_lm's transformer trained 50 steps under context parallelism equals one process, within 1e-5",
          "[cp][cp_training]") {
  for (const auto rotation : {accel::cp_comm_strategy::allgather, accel::cp_comm_strategy::alltoall}) {
    cp_accelerator acc(cp_options(rotation));
    const std::int64_t parts = acc.num_processes();
    torch::manual_seed(6);
    auto net = char_transformer();
    torch::optim::SGD optimizer(net->parameters(), transformer_sgd());
    std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
    for (int i = 0; i < transformer_steps; ++i) batches.push_back(characters(i));
    auto [model, opt, data] = acc.prepare(net, optimizer, batches);
    for (const auto& [x, y] : data) {
      const auto positions = torch::arange(8);
      auto scope = accel::maybe_context_parallel(acc, {x, y, positions}, {1, 1, 0});
      CHECK(x.size(1) == 8 / parts);
      const auto before = scope.counts();
      acc.backward(torch::nn::functional::cross_entropy(model(x, positions).reshape({-1, 24}), y.reshape({-1})));
      const auto after = scope.counts();
      if (parts > 1 && rotation == accel::cp_comm_strategy::allgather) {  // per attention layer: 1 forward, 2 backward
        CHECK(after.forward_all_gathers - before.forward_all_gathers == 2);
        CHECK(after.backward_all_gathers - before.backward_all_gathers == 2);
        CHECK(after.backward_reduce_scatters - before.backward_reduce_scatters == 2);
      } else if (parts > 1) {
        CHECK(after.forward_exchanges - before.forward_exchanges == 2 * (parts - 1));
        CHECK(after.backward_exchanges - before.backward_exchanges == 2 * parts);
      }
      opt.step();
      opt.zero_grad();
    }
    check_within_1e5(acc.get_state_dict(model), train_alone(1));
  }
}

/// The transformer trained 50 steps under `Parallel` on the job's mesh (cp above 1; `split` by the plan for the
/// tensor-parallel policies), each dp rank on its batches, equal to one process on the dp ranks' batches together
/// within 1e-5; saved to checkpoint `save` when given.
template <class Parallel, bool split = false>
void check_beside_cp(const std::string& save = {}) {
  accel::accelerator<accel::fp32, Parallel> acc;
  const auto& sizes = acc.parallelism_config()->sizes();
  REQUIRE(sizes.cp > 1);
  const int dp = sizes.dp_replicate * sizes.dp_shard;
  // Process 0's weights everywhere: the others start elsewhere, and prepare (or parallelize_module) brings them to
  // process 0's.
  torch::manual_seed(acc.process_index() == 0 ? 6 : 60 + acc.process_index());
  auto net = char_transformer();
  if constexpr (split) accel::parallelize_module(acc, net, char_transformer_plan());
  torch::optim::SGD optimizer(net->parameters(), transformer_sgd());
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < transformer_steps * dp; ++i) batches.push_back(characters(i));
  auto [model, opt, data] = acc.prepare(net, optimizer, batches);
  for (const auto& [x, y] : data) {
    const auto positions = torch::arange(8);
    auto scope = accel::maybe_context_parallel(acc, {x, y, positions}, {1, 1, 0});
    const auto logits = model(x, positions);
    if constexpr (split)
      acc.backward(accel::vocab_parallel_cross_entropy(acc, logits, y));
    else
      acc.backward(torch::nn::functional::cross_entropy(logits.reshape({-1, 24}), y.reshape({-1})));
    opt.step();
    opt.zero_grad();
  }
  check_within_1e5(acc.get_state_dict(model), train_alone(dp));
  if (!save.empty()) acc.save_state(cross_job_directory() / save);
}

TEST_CASE("FSDP x CP x TP (dp_shard 2 x cp 2 x tp 2) trains char_lm's transformer as one process, within 1e-5",
          "[cp][cp_3d]") {
  check_beside_cp<accel::fully_sharded_tensor_parallel<accel::gloo>, true>("fsdp_cp_tp");  // for [cp_load]
}

TEST_CASE("HSDP x CP (dp_replicate 2 x dp_shard 2 x cp 2) trains char_lm's transformer as one process, within 1e-5",
          "[cp][cp_hsdp]") {
  check_beside_cp<accel::hybrid_sharded<accel::gloo>>();
}

TEST_CASE("TP x CP (cp 2 x tp 2) trains char_lm's transformer as one process, within 1e-5", "[cp][cp_tp]") {
  check_beside_cp<accel::tensor_parallel<accel::gloo>, true>();
}

TEST_CASE("FSDP x CP (dp_shard 2 x cp 2) trains char_lm's transformer as one process, within 1e-5", "[cp][cp_fsdp]") {
  check_beside_cp<accel::fully_sharded<accel::gloo>>();
}

/// Under `Accelerator`, the transformer (starting elsewhere) loads checkpoint `from` and saves it again to `to`,
/// nothing trained between.
template <class Accelerator>
void load_and_save(const std::filesystem::path& from, const std::filesystem::path& to) {
  Accelerator acc;
  torch::manual_seed(99);
  auto net = char_transformer();
  torch::optim::SGD optimizer(net->parameters(), transformer_sgd());
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < transformer_steps * 2; ++i) batches.push_back(characters(i));
  auto [model, opt, data] = acc.prepare(net, optimizer, batches);
  acc.load_state(from);
  acc.save_state(to);
}

/// The momentum buffers an SGD optimizer of the transformer loads from a checkpoint's `optimizer.bin`.
std::vector<torch::Tensor> momentum_in(const std::filesystem::path& file) {
  auto net = char_transformer();
  torch::optim::SGD optimizer(net->parameters(), transformer_sgd());
  torch::serialize::InputArchive archive;
  archive.load_from(file.string());
  optimizer.load(archive);
  std::vector<torch::Tensor> buffers;
  for (auto& p : optimizer.param_groups()[0].params()) {
    const auto found = optimizer.state().find(accel::detail::compat::optimizer_state_key(p));
    if (found != optimizer.state().end())
      buffers.push_back(static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer());
  }
  return buffers;
}

TEST_CASE("a checkpoint saved at dp_shard 2 x cp 2 x tp 2 loads at cp = 2 and on one process, bit for bit",
          "[cp_load]") {
  const auto saved = cross_job_directory() / "fsdp_cp_tp";
  const bool split = std::getenv("PARALLELISM_CONFIG_CP_SIZE") != nullptr;
  const auto again = cross_job_directory() / (split ? "loaded_cp2" : "loaded_1");
  if (split)
    load_and_save<cp_accelerator>(saved, again);
  else
    load_and_save<accel::accelerator<accel::fp32>>(saved, again);
  std::vector<torch::Tensor> weights, weights_again;
  for (auto& [name, tensor] : accel::safetensors::load(saved / "model.safetensors")) weights.push_back(tensor);
  for (auto& [name, tensor] : accel::safetensors::load(again / "model.safetensors")) weights_again.push_back(tensor);
  REQUIRE(weights.size() == char_transformer()->parameters().size());
  REQUIRE(weights_again.size() == weights.size());
  for (std::size_t i = 0; i < weights.size(); ++i) CHECK(torch::equal(weights[i], weights_again[i]));
  const auto momentum = momentum_in(saved / "optimizer.bin");
  CHECK(momentum.size() == weights.size());
  CHECK(accel_test::all_equal(momentum, momentum_in(again / "optimizer.bin")));
}

TEST_CASE("ring attention's activation memory per process stays flat as the sequence grows with cp", "[cp_memory]") {
  accel::count_cpu_memory();
  cp_accelerator acc(cp_options(accel::cp_comm_strategy::alltoall));
  const std::int64_t parts = acc.num_processes(), local = 1024, length = local * parts;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(17);
  auto q = torch::randn({1, 2, length, 16}, generator), k = torch::randn({1, 2, length, 16}, generator),
       v = torch::randn({1, 2, length, 16}, generator);
  auto scope = accel::maybe_context_parallel(acc, {q, k, v}, {2, 2, 2}, {q, k, v});
  q.requires_grad_(true);
  k.requires_grad_(true);
  v.requires_grad_(true);
  const c10::Device cpu(c10::kCPU);
  accel::reset_peak_memory_stats(cpu);
  const auto before = accel::memory_stats(cpu).allocated;
  // cp = 1 runs the same ring code as one process (no group), not the plain attention outside a scope.
  const accel::detail::cp::attention_plan plan{parts == 1 ? nullptr : accel::detail::cp::current_scope()->group,
                                               {static_cast<int>(parts), true},
                                               accel::cp_comm_strategy::alltoall,
                                               0.25};
  const accel::detail::cp::mask_rule rule{true, {}, {}};
  accel::detail::cp::ring_attention::apply(q, k, v, plan, rule).sum().backward();
  const auto peak = accel::memory_stats(cpu).peak_allocated - before;
  INFO("cp = " << parts << ", " << length << " tokens: " << peak << " bytes at the peak");
  // The formula of docs/parallelism.md, per query-key pair of a part: about 8 bytes with LibTorch's fused CPU
  // kernel (the pair's mask, as float and bool, shared by the heads), about 16 per head and batch row with accel's
  // float32 math (its score blocks). Whatever cp is.
  const double per_pair = static_cast<double>(peak) / static_cast<double>(local * local);
#if ACCEL_HAS_CPU_FLASH_ATTENTION
  CHECK(per_pair > 4);
  CHECK(per_pair < 12);
#else
  CHECK(per_pair / 2 > 12);
  CHECK(per_pair / 2 < 24);
#endif
  if (acc.process_index() == 0) {
    std::filesystem::create_directories(cross_job_directory());
    std::ofstream(cross_job_directory() / ("peak_cp" + std::to_string(parts))) << peak << "\n";
  }
}

}  // namespace cp_test
