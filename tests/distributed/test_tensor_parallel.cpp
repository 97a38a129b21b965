// Issue 34 item 3: tensor parallelism (accel/tensor_parallel.hpp) on real Gloo processes, as `accel launch
// --parallelism_config_tp_size 2` (and --parallelism_config_dp_shard_size 2 beside, on 4) starts them (mesh.tp.* in
// tests/CMakeLists.txt). Each process also trains the same model alone, unsplit, on the whole job's batches: the
// reference the split run must equal.
// LibTorch first: its logging header defines a CHECK of its own, which Catch's must replace (accel_tests' precompiled
// header includes them in this order too).
#include "support.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <numeric>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "char_transformer_training.hpp"

namespace {

using tp_policy = accel::tensor_parallel<accel::gloo>;
using tp_accelerator = accel::accelerator<accel::fp32, tp_policy>;

/// An MLP whose middle pair is Megatron's: fc1 column-parallel, fc2 row-parallel; fc0 stays whole, so that fc1's
/// input needs a gradient (the pair's backward all-reduce).
struct mlpImpl : torch::nn::Module {
  mlpImpl() {
    fc0 = register_module("fc0", torch::nn::Linear(6, 8));
    fc1 = register_module("fc1", torch::nn::Linear(8, 12));
    fc2 = register_module("fc2", torch::nn::Linear(12, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(torch::tanh(fc0(x))))); }
  torch::nn::Linear fc0{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(mlp);

const accel::tensor_parallel_plan mlp_plan{{"fc1", accel::colwise_parallel{}}, {"fc2", accel::rowwise_parallel{}}};

constexpr int steps = 50;
constexpr int rows = 4;            // per batch; the job's global batch is rows x dp
constexpr double max_norm = 0.05;  // small enough that every step clips

/// Batch `i` of the data: the same on every process.
std::pair<torch::Tensor, torch::Tensor> batch(int i) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + i);
  return {torch::randn({rows, 6}, generator), torch::randn({rows, 4}, generator)};
}

/// What a run leaves: the full parameters (get_state_dict's, in the model's order) and each step's gradient norm.
struct run {
  std::vector<torch::Tensor> parameters;
  std::vector<double> norms;
};

/// The model trained alone, unsplit: each step on the job's whole global batch (the dp ranks' batches together).
run train_alone(int dp) {
  torch::manual_seed(3);
  mlp net;
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
  run result;
  for (int step = 0; step < steps; ++step) {
    std::vector<torch::Tensor> xs, ys;
    for (int r = 0; r < dp; ++r) {
      auto [x, y] = batch(step * dp + r);
      xs.push_back(x);
      ys.push_back(y);
    }
    optimizer.zero_grad();
    torch::mse_loss(net->forward(torch::cat(xs)), torch::cat(ys)).backward();
    result.norms.push_back(torch::nn::utils::clip_grad_norm_(net->parameters(), max_norm));
    optimizer.step();
  }
  for (const auto& p : net->parameters()) result.parameters.push_back(p.detach().clone());
  return result;
}

/// The parameters' numbers of elements, in the model's order.
std::vector<std::int64_t> sizes_of(const std::vector<torch::Tensor>& parameters) {
  std::vector<std::int64_t> sizes;
  for (const auto& p : parameters) sizes.push_back(p.numel());
  return sizes;
}

/// `got` equals `expected` within 1e-5, parameter by parameter.
void check_within_1e5(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& expected) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto difference = (got[i] - expected[i]).abs().max().item<double>();
    INFO("parameter " << i << ", max difference " << difference);
    CHECK(got[i].sizes() == expected[i].sizes());
    CHECK(difference <= 1e-5);
  }
}

}  // namespace

TEST_CASE("tensor_parallel trains an MLP as one process does on the whole batch, within 1e-5 over 50 steps",
          "[tp][tp_parity]") {
  tp_accelerator acc;
  const auto& mesh = acc.parallel().mesh();
  const int tp = mesh.layout().size("tp");
  const int dp = acc.num_processes() / tp;
  const auto expected = train_alone(dp);

  // Process 0 starts where train_alone does, the others elsewhere: parallelize_module gives every one process 0's.
  torch::manual_seed(acc.process_index() == 0 ? 3 : 17 + acc.process_index());
  mlp net;
  const auto full_sizes = sizes_of(net->parameters());
  accel::parallelize_module(acc, net, mlp_plan);
  CHECK((acc.parallel().split_layers() == std::vector<std::string>{"fc1", "fc2"}));
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));

  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < steps * dp; ++i) batches.push_back(batch(i));
  auto [model, opt, data] = acc.prepare(net, optimizer, batches);

  run got;
  int step = 0;
  for (const auto& [x, y] : data) {
    // TP peers read the same batch, the one of their dp rank (Accelerate's loader divides the index by tp x cp).
    CHECK(torch::equal(x, batches[static_cast<std::size_t>(step * dp + acc.process_index() / tp)].first));
    const auto before = acc.parallel().all_reduces();
    acc.backward(torch::mse_loss(model(x), y));
    const auto after = acc.parallel().all_reduces();
    CHECK(after.forward_all_reduces - before.forward_all_reduces == 1);  // one per column/row pair, each way
    CHECK(after.backward_all_reduces - before.backward_all_reduces == 1);
    got.norms.push_back(acc.clip_grad_norm_(model->parameters(), max_norm));
    opt.step();
    opt.zero_grad();
    ++step;
  }
  REQUIRE(step == steps);
  for (auto& [name, tensor] : acc.get_state_dict(model)) got.parameters.push_back(tensor);

  REQUIRE(got.parameters.size() == expected.parameters.size());
  for (std::size_t i = 0; i < got.parameters.size(); ++i) {
    const auto difference = (got.parameters[i] - expected.parameters[i]).abs().max().item<double>();
    INFO("parameter " << i << ", max difference " << difference);
    CHECK(got.parameters[i].sizes() == expected.parameters[i].sizes());
    CHECK(difference <= 1e-5);
  }
  // Clipping is global over tp and dp: every step's norm is the whole model's, and clipped (norm above max_norm).
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s);
    CHECK(std::abs(got.norms[s] - expected.norms[s]) <= 1e-5 * expected.norms[s]);
    CHECK(expected.norms[s] > max_norm);
  }
  // The optimizer's state lives on the local slices (Accelerate's #3835 cannot happen): fc1's weight and bias and
  // fc2's weight hold 1/tp of theirs, fc0 and fc2's bias their whole.
  const std::vector<std::int64_t> divisor{1, 1, tp, tp, tp, 1};
  const auto params = net->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << i);
    const auto& state = static_cast<torch::optim::AdamWParamState&>(
        *optimizer.state().at(accel::detail::compat::optimizer_state_key(params[i])));
    CHECK(state.exp_avg().numel() == full_sizes[i] / divisor[i]);
    CHECK(state.exp_avg_sq().numel() == full_sizes[i] / divisor[i]);
    CHECK(params[i].numel() == full_sizes[i] / divisor[i]);
  }
}

namespace {

/// A small language model split as Megatron splits a transformer: the embedding by its vocabulary, an MLP pair,
/// and the output layer column-parallel, so that its logits stay split by the vocabulary into the parallel
/// cross-entropy.
struct lmImpl : torch::nn::Module {
  static constexpr int vocabulary = 16;
  lmImpl() {
    embed = register_module("embed", torch::nn::Embedding(vocabulary, 8));
    fc1 = register_module("fc1", torch::nn::Linear(8, 12));
    fc2 = register_module("fc2", torch::nn::Linear(12, 8));
    head = register_module("head", torch::nn::Linear(8, vocabulary));
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    const auto h = torch::tanh(embed(ids));
    return head(torch::tanh(h + fc2(torch::tanh(fc1(h)))));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
};
TORCH_MODULE(lm);

const accel::tensor_parallel_plan lm_plan{{"embed", accel::rowwise_parallel{}},
                                          {"fc1", accel::colwise_parallel{}},
                                          {"fc2", accel::rowwise_parallel{}},
                                          {"head", accel::colwise_parallel{}}};

/// Token batch `i`: ids and the next ids, [rows, 5].
std::pair<torch::Tensor, torch::Tensor> tokens(int i) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(2000 + i);
  return {torch::randint(lmImpl::vocabulary, {rows, 5}, generator),
          torch::randint(lmImpl::vocabulary, {rows, 5}, generator)};
}

/// The language model trained alone on the job's whole global batches, with the whole logits' cross-entropy, for
/// `count` steps.
std::vector<torch::Tensor> train_lm_alone(int dp, int count = steps) {
  torch::manual_seed(4);
  lm net;
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
  for (int step = 0; step < count; ++step) {
    std::vector<torch::Tensor> xs, ys;
    for (int r = 0; r < dp; ++r) {
      auto [x, y] = tokens(step * dp + r);
      xs.push_back(x);
      ys.push_back(y);
    }
    optimizer.zero_grad();
    const auto logits = net->forward(torch::cat(xs));
    torch::nn::functional::cross_entropy(logits.reshape({-1, lmImpl::vocabulary}), torch::cat(ys).reshape({-1}))
        .backward();
    optimizer.step();
  }
  std::vector<torch::Tensor> parameters;
  for (const auto& p : net->parameters()) parameters.push_back(p.detach().clone());
  return parameters;
}

}  // namespace

TEST_CASE("tensor_parallel trains a vocabulary-parallel language model as one process, within 1e-5 over 50 steps",
          "[tp][tp_parity]") {
  tp_accelerator acc;
  const int tp = acc.parallel().mesh().layout().size("tp");
  const int dp = acc.num_processes() / tp;
  const auto expected = train_lm_alone(dp);

  torch::manual_seed(acc.process_index() == 0 ? 4 : 40 + acc.process_index());
  lm net;
  accel::parallelize_module(acc, net, lm_plan);
  CHECK(net->embed->weight.size(0) == lmImpl::vocabulary / tp);
  CHECK(net->head->weight.size(0) == lmImpl::vocabulary / tp);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < steps * dp; ++i) batches.push_back(tokens(i));
  auto [model, opt, data] = acc.prepare(net, optimizer, batches);
  int step = 0;
  for (const auto& [x, y] : data) {
    const auto before = acc.parallel().all_reduces();
    const auto logits = model(x);
    CHECK(logits.size(-1) == lmImpl::vocabulary / tp);  // split by the vocabulary, never gathered
    acc.backward(accel::vocab_parallel_cross_entropy(acc, logits, y));
    const auto after = acc.parallel().all_reduces();
    // Forward: the embedding's sum and the MLP pair's; backward: the inputs of fc1 and of the head.
    CHECK(after.forward_all_reduces - before.forward_all_reduces == 2);
    CHECK(after.backward_all_reduces - before.backward_all_reduces == 2);
    opt.step();
    opt.zero_grad();
    ++step;
  }
  REQUIRE(step == steps);
  std::vector<torch::Tensor> got;
  for (auto& [name, tensor] : acc.get_state_dict(model)) got.push_back(tensor);
  check_within_1e5(got, expected);
}

namespace {

using accel_test::char_transformer;
using accel_test::char_transformer_plan;
using accel_test::characters;
using accel_test::train_char_transformer_alone;
using accel_test::transformer_sgd;

/// char_lm's transformer made as the reference is (process 0's weights: the others start elsewhere, and
/// parallelize_module must bring them to process 0's), then split by `plan`.
template <class Accelerator>
CharTransformer split_char_transformer(Accelerator& acc, const accel::tensor_parallel_plan& plan) {
  torch::manual_seed(acc.process_index() == 0 ? 6 : 60 + acc.process_index());
  auto net = char_transformer();
  accel::parallelize_module(acc, net, plan);
  return net;
}

/// The split `net` trained on this dp rank's batches of the job; `check_counts(before, after)` sees the tp
/// collectives counted before and after each step's forward and backward, and `after_step(acc, net, optimizer)`
/// runs after each optimizer step. Returns the full parameters (get_state_dict's).
template <class Accelerator, class CheckCounts,
          class AfterStep = void (*)(Accelerator&, torch::nn::Module&, torch::optim::Optimizer&)>
std::vector<torch::Tensor> train_split(
    Accelerator& acc, CharTransformer net, CheckCounts check_counts,
    AfterStep after_step = [](Accelerator&, torch::nn::Module&, torch::optim::Optimizer&) {}) {
  const int dp = acc.num_processes() / acc.parallel().mesh().layout().size("tp");
  torch::optim::SGD optimizer(net->parameters(), transformer_sgd());
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < steps * dp; ++i) batches.push_back(characters(i));
  auto [model, opt, data] = acc.prepare(net, optimizer, batches);
  for (const auto& [x, y] : data) {
    const auto before = acc.parallel().all_reduces();
    acc.backward(accel::vocab_parallel_cross_entropy(acc, model(x), y));
    check_counts(before, acc.parallel().all_reduces());
    opt.step();
    opt.zero_grad();
    after_step(acc, *net, optimizer);
  }
  std::vector<torch::Tensor> got;
  for (auto& [name, tensor] : acc.get_state_dict(model)) got.push_back(tensor);
  return got;
}

/// char_transformer_plan with Megatron's sequence parallelism: the residual stream between the pairs holds this
/// rank's shard of the sequence (dimension 1 of [batch, sequence, features]). The token embedding reduce-scatters
/// its output, the position embedding's lookup ([sequence, features]) is cut along dimension 0; the norms and dropout
/// run on the shard; each column-parallel layer all-gathers its input, each row-parallel one reduce-scatters its
/// output.
accel::tensor_parallel_plan sequence_parallel_plan() {
  accel::tensor_parallel_plan plan{{"token_embedding", accel::rowwise_parallel{.sequence_parallel = true}},
                                   {"position_embedding", accel::sequence_parallel{.sequence_dim = 0}},
                                   {"norm", accel::sequence_parallel{}},
                                   {"head", accel::colwise_parallel{.sequence_parallel = true}}};
  for (const std::string block : {"blocks.0.", "blocks.1."}) {
    plan.emplace_back(block + "norm1", accel::sequence_parallel{});
    plan.emplace_back(block + "attention.qkv", accel::colwise_parallel{.fused = 3, .sequence_parallel = true});
    plan.emplace_back(block + "attention.out", accel::rowwise_parallel{.sequence_parallel = true});
    plan.emplace_back(block + "drop", accel::sequence_parallel{});
    plan.emplace_back(block + "norm2", accel::sequence_parallel{});
    plan.emplace_back(block + "mlp.0", accel::colwise_parallel{.sequence_parallel = true});
    plan.emplace_back(block + "mlp.2", accel::rowwise_parallel{.sequence_parallel = true});
  }
  return plan;
}

}  // namespace

TEST_CASE("tensor_parallel trains char_lm's transformer as one process on the whole batch, within 1e-5 over 50 steps",
          "[tp][tp_parity]") {
  tp_accelerator acc;
  const int tp = acc.parallel().mesh().layout().size("tp");
  const auto expected = train_char_transformer_alone(acc.num_processes() / tp);
  auto net = split_char_transformer(acc, char_transformer_plan());
  CHECK(net->blocks[0]->as<Block>()->attention->qkv->weight.size(0) == 3 * 16 / tp);
  check_within_1e5(
      train_split(acc, net,
                  [](const accel::tensor_parallel_counts& before, const accel::tensor_parallel_counts& after) {
                    // Forward: the embedding's, and each block's two pairs; backward: each block's two
                    // pairs' inputs and the head's.
                    CHECK(after.forward_all_reduces - before.forward_all_reduces == 1 + 2 * 2);
                    CHECK(after.backward_all_reduces - before.backward_all_reduces == 2 * 2 + 1);
                  }),
      expected);
}

TEST_CASE(
    "tensor_parallel with sequence parallelism trains char_lm's transformer as one process on the whole batch, "
    "within 1e-5 over 50 steps: an all-gather and a reduce-scatter each way per pair, no all-reduce, the activations "
    "between the pairs 1/tp of the sequence",
    "[tp][tp_parity]") {
  tp_accelerator acc;
  const int tp = acc.parallel().mesh().layout().size("tp");
  const auto expected = train_char_transformer_alone(acc.num_processes() / tp);
  auto net = split_char_transformer(acc, sequence_parallel_plan());
  {  // The residual stream into and out of a block: rows x 8 / tp positions, each of 16 features.
    at::NoGradGuard no_grad;
    const auto scope = acc.parallel().forward_scope();
    auto x = net->token_embedding(characters(0).first) + net->position_embedding(torch::arange(8));
    CHECK(x.sizes() == torch::IntArrayRef{rows, 8 / tp, 16});
    x = net->blocks[1]->as<Block>()->forward(net->blocks[0]->as<Block>()->forward(x));
    CHECK(x.sizes() == torch::IntArrayRef{rows, 8 / tp, 16});
    CHECK(net->norm(x).numel() == rows * 8 * 16 / tp);
  }
  check_within_1e5(
      train_split(acc, net,
                  [](const accel::tensor_parallel_counts& before, const accel::tensor_parallel_counts& after) {
                    // Forward: the embedding's reduce-scatter, each block's two pairs' all-gather and reduce-scatter,
                    // the head's all-gather. Backward, the mirror: the head's and the pairs' input gradients
                    // reduce-scattered, the pairs' and both embeddings' output gradients all-gathered.
                    CHECK(after.forward_all_gathers - before.forward_all_gathers == 2 * 2 + 1);
                    CHECK(after.forward_reduce_scatters - before.forward_reduce_scatters == 1 + 2 * 2);
                    CHECK(after.backward_reduce_scatters - before.backward_reduce_scatters == 2 * 2 + 1);
                    CHECK(after.backward_all_gathers - before.backward_all_gathers == 2 * 2 + 2);
                    CHECK(after.forward_all_reduces == before.forward_all_reduces);
                    CHECK(after.backward_all_reduces == before.backward_all_reduces);
                    // The norms' weights and biases (5 norms) and the row-parallel layers' biases (4) saw a shard.
                    CHECK(after.gradient_all_reduces - before.gradient_all_reduces == 5 * 2 + 4);
                  }),
      expected);
}

TEST_CASE("tensor_parallel refuses what it cannot split, naming the fix", "[tp][tp_refusals]") {
  using Catch::Matchers::Contains;
  tp_accelerator acc;
  const int tp = acc.parallel().mesh().layout().size("tp");
  mlp net;
  CHECK_THROWS_WITH(accel::parallelize_module(acc, net, {{"fc9", accel::colwise_parallel{}}}),
                    Contains("no module \"fc9\"") && Contains("its Linear and Embedding layers are fc0, fc1, fc2"));
  torch::nn::Sequential odd(torch::nn::Linear(8, 2 * tp + 1), torch::nn::Tanh());
  CHECK_THROWS_WITH(accel::parallelize_module(acc, odd, {{"0", accel::colwise_parallel{}}}),
                    Contains("\"0\" has " + std::to_string(2 * tp + 1) +
                             " output features, which tp = " + std::to_string(tp) + " does not divide"));
  CHECK_THROWS_WITH(accel::parallelize_module(acc, odd, {{"1", accel::rowwise_parallel{}}}),
                    Contains("split torch::nn::Linear layers"));
  CHECK_THROWS_WITH(accel::parallelize_module(acc, odd, {{"0", accel::colwise_parallel{.fused = 3}}}),
                    Contains("colwise_parallel{.fused = 3} cannot cut into equal parts"));
  torch::nn::Sequential table(torch::nn::Embedding(torch::nn::EmbeddingOptions(8, 4).padding_idx(0)));
  CHECK_THROWS_WITH(accel::parallelize_module(acc, table, {{"0", accel::rowwise_parallel{}}}),
                    Contains("splits by its vocabulary with rowwise_parallel") && Contains("without padding_idx"));
  CHECK_THROWS_WITH(
      accel::parallelize_module(acc, odd, {{"0", accel::sequence_parallel{}}}),
      Contains("\"0\" is a torch::nn::Linear") && Contains("sequence_parallel runs torch::nn::LayerNorm"));
  CHECK_THROWS_WITH(accel::parallelize_module(
                        acc, odd, {{"0", accel::colwise_parallel{.sequence_parallel = true, .sequence_dim = -1}}}),
                    Contains("\"0\" has sequence_dim -1"));
  {  // A sequence that tp does not divide, refused on every process before any collective.
    auto transformer = char_transformer();
    accel::parallelize_module(acc, transformer, sequence_parallel_plan());
    at::NoGradGuard no_grad;
    const auto scope = acc.parallel().forward_scope();
    CHECK_THROWS_WITH(transformer->forward(torch::randint(24, {2, 2 * tp + 1})),
                      // The token or the position embedding, whichever the compiler evaluates first.
                      Contains("embedding\" cuts the sequence (dimension ") &&
                          Contains(std::to_string(2 * tp + 1) + " long) into tp = " + std::to_string(tp) + " parts") &&
                          Contains("use a sequence length that tp divides"));
  }
  CHECK_THROWS_WITH(accel::detail::tp::tensor_parallel_mesh(std::nullopt, 2),
                    Contains("no tp dimension") && Contains("--parallelism_config_tp_size T"));
  const std::optional<accel::mesh_layout> cp_beside(accel::mesh_layout({.cp = 2, .tp = 2}, 4));
  CHECK(&accel::detail::tp::tensor_parallel_mesh(cp_beside, 4) == &*cp_beside);  // context parallelism beside
}

TEST_CASE(
    "gather_for_metrics and split_between_processes under tensor_parallel count each dp rank's batch once, the tp "
    "peers' copies not again, and drop what even_batches duplicated",
    "[tp_metrics]") {
  tp_accelerator acc;
  const int tp = acc.parallel().mesh().layout().size("tp");
  const int dp = acc.num_processes() / tp;
  for (auto [n, b] : {std::pair<std::int64_t, std::int64_t>{10, 4}, {7, 3}, {99, 16}}) {
    INFO("N " << n << " B " << b);
    std::vector<torch::Tensor> batches;  // arange(n) in batches of b, the last one short
    for (std::int64_t start = 0; start < n; start += b) batches.push_back(torch::arange(start, std::min(n, start + b)));
    std::vector<torch::Tensor> steps;
    std::vector<std::int64_t> objects;
    for (auto&& batch : acc.prepare(batches)) {
      steps.push_back(acc.gather_for_metrics(batch));
      const std::vector<std::int64_t> ids(batch.data_ptr<std::int64_t>(),
                                          batch.data_ptr<std::int64_t>() + batch.numel());
      const auto gathered = acc.gather_for_metrics(ids, /*use_gather_object=*/true);
      objects.insert(objects.end(), gathered.begin(), gathered.end());
    }
    CHECK(torch::equal(torch::cat(steps), torch::arange(n)));  // every sample once, in order
    std::vector<std::int64_t> expected(static_cast<std::size_t>(n));
    std::iota(expected.begin(), expected.end(), 0);
    CHECK(objects == expected);
    if (dp == 2 && n == 10) {  // Accelerate's: rounds of 2 x 4 samples, the last one's remainder 2
      CHECK(torch::equal(steps[0], torch::arange(8)));
      CHECK(torch::equal(steps[1], torch::tensor({8, 9}, torch::kLong)));
    }
  }
  // One value per dp rank, in the dp ranks' order.
  const auto ranks = acc.gather_for_metrics(torch::scalar_tensor(acc.process_index() / tp, torch::kLong));
  CHECK(torch::equal(ranks, torch::arange(dp)));
  // split_between_processes parts by the dp rank: the tp peers get the same part; gathered, each part once.
  const auto part = acc.split_between_processes(torch::arange(7));
  const auto peers_parts = acc.gather(part.sum().reshape({1}));
  for (int r = 0; r < acc.num_processes(); ++r)
    CHECK(peers_parts[r].item<std::int64_t>() == peers_parts[r - r % tp].item<std::int64_t>());
  CHECK(torch::equal(acc.gather_for_metrics(part), torch::arange(7)));
  const std::vector<std::int64_t> items{0, 1, 2, 3, 4, 5, 6};
  CHECK(acc.gather_for_metrics(acc.split_between_processes(items), /*use_gather_object=*/true) == items);
}

namespace {

constexpr int saved_at = 10;  // the save job's steps; the loading jobs train as many again

/// Where the tp = 2 job saves its checkpoint for the jobs at tp = 1 and tp = 4 (tests/CMakeLists.txt sets it).
std::filesystem::path tp_checkpoint() {
  const char* dir = std::getenv("ACCEL_TEST_CROSS_JOB_DIR");
  REQUIRE(dir != nullptr);
  return std::filesystem::path(dir) / "tensor_parallel_tp2";
}

/// The language model under `Accelerator` (tensor parallelism: split by lm_plan; one process: whole) trained on token
/// batches [from, from + count) of a job with one dp rank, from the checkpoint `load` (when not empty), saved to
/// `save` (when not empty); returns the full parameters.
template <class Accelerator>
std::vector<torch::Tensor> train_lm(int from, int count, const std::filesystem::path& load,
                                    const std::filesystem::path& save) {
  constexpr bool split = !std::is_same_v<typename Accelerator::parallel_type, accel::single_process>;
  Accelerator acc;
  torch::manual_seed(load.empty() ? 4 : 99);  // a loading job starts elsewhere: the checkpoint must bring it back
  lm net;
  if constexpr (split) accel::parallelize_module(acc, net, lm_plan);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = from; i < from + count; ++i) batches.push_back(tokens(i));
  auto [model, opt, data] = acc.prepare(net, optimizer, batches);
  if (!load.empty()) acc.load_state(load);
  for (const auto& [x, y] : data) {
    const auto logits = model(x);
    if constexpr (split)
      acc.backward(accel::vocab_parallel_cross_entropy(acc, logits, y));
    else
      acc.backward(torch::nn::functional::cross_entropy(logits.reshape({-1, lmImpl::vocabulary}), y.reshape({-1})));
    opt.step();
    opt.zero_grad();
  }
  if (!save.empty()) acc.save_state(save);
  std::vector<torch::Tensor> parameters;
  for (auto& [name, tensor] : acc.get_state_dict(model)) parameters.push_back(tensor);
  return parameters;
}

/// `got` equals training alone for `count` steps within 1e-5, parameter by parameter.
void check_as_alone(const std::vector<torch::Tensor>& got, int count) {
  check_within_1e5(got, train_lm_alone(1, count));
}

}  // namespace

TEST_CASE("tensor_parallel saves whole weights and optimizer state at tp = 2", "[tp_save]") {
  const auto dir = tp_checkpoint();
  check_as_alone(train_lm<tp_accelerator>(0, saved_at, {}, dir), saved_at);
  // The files hold the whole model: what one process without tensor parallelism reads.
  const auto weights = accel::safetensors::load(dir / "model.safetensors");
  std::map<std::string, torch::Tensor> by_name(weights.begin(), weights.end());
  CHECK(by_name.at("embed.weight").size(0) == lmImpl::vocabulary);
  CHECK(by_name.at("head.weight").size(0) == lmImpl::vocabulary);
  CHECK(by_name.at("fc2.weight").size(1) == 12);
}

TEST_CASE("a checkpoint saved at tp = 2 resumes at tp = 1 and tp = 4 as one process trains on", "[tp_load]") {
  const auto dir = tp_checkpoint();
  const char* tp = std::getenv("PARALLELISM_CONFIG_TP_SIZE");
  const auto got = tp != nullptr && std::string(tp) != "1"
                       ? train_lm<tp_accelerator>(saved_at, saved_at, dir, {})
                       : train_lm<accel::accelerator<accel::fp32>>(saved_at, saved_at, dir, {});
  check_as_alone(got, 2 * saved_at);
}

// fp8 beside tensor parallelism: the split layers' local products in float8, each operand cast with the scale of the
// whole tensor (its amax maxed over the tp group where the split divides it: DTensor's amax in torchao), so that every
// gradient a process holds is its slice of one process's fp8 gradient, bit for bit.

namespace {

/// A column-parallel fc1 then a row-parallel fc2, every width a multiple of 16 (fp8 converts both).
struct fp8_pairImpl : torch::nn::Module {
  fp8_pairImpl()
      : fc1(register_module("fc1", torch::nn::Linear(32, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 48))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(fc1(x)); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(fp8_pair);

/// fp8 on every Linear (not only those between the first and the last).
accel::options every_linear_in_fp8() {
  accel::options chosen;
  chosen.fp8.module_filter_func = [](const torch::nn::Module&, const std::string&) { return true; };
  return chosen;
}

/// Each of two SGD steps' gradients of fc1's weight and bias and fc2's weight (the loss: the output's sum, whose
/// gradient is the same on every process), after `net` (process 0's weights) trained under `acc` on fixed rows.
template <class Accelerator>
std::vector<torch::Tensor> fp8_pair_gradients(Accelerator& acc, fp8_pair net) {
  torch::optim::SGD sgd(net->parameters(), 0.05);
  auto [model, opt] = acc.prepare(net, sgd);
  std::vector<torch::Tensor> gradients;
  for (int step = 0; step < 2; ++step) {
    const auto x = torch::randn({24, 32}, at::make_generator<at::CPUGeneratorImpl>(700 + step));
    acc.backward(model(x).sum());
    for (const auto& p : {net->fc1->weight, net->fc1->bias, net->fc2->weight}) gradients.push_back(p.grad().clone());
    opt.step();
    opt.zero_grad();
  }
  return gradients;
}

template <class Recipe>
void check_fp8_beside_tp(std::int64_t amax_all_reduces_per_step) {
  torch::manual_seed(31);
  fp8_pair alone;
  auto alone_options = every_linear_in_fp8();
  alone_options.parallelism_config = {.dp_replicate_size = 1, .dp_shard_size = 1, .tp_size = 1, .cp_size = 1};
  accel::accelerator<accel::fp8<Recipe>> one_process(alone_options);  // not the job's mesh: a mesh of one
  const auto expected = fp8_pair_gradients(one_process, alone);

  accel::accelerator<accel::fp8<Recipe>, accel::tensor_parallel<accel::gloo>> acc(every_linear_in_fp8());
  torch::manual_seed(acc.process_index() == 0 ? 31 : 310 + acc.process_index());
  fp8_pair net;
  accel::parallelize_module(acc, net, mlp_plan);
  const auto got = fp8_pair_gradients(acc, net);
  CHECK((acc.precision().converted_layers() == std::vector<std::string>{"fc1", "fc2"}));
  const int rank = acc.tensor_parallel_rank(), tp = acc.parallel().mesh().layout().size("tp");
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::int64_t dimension = i % 3 == 2 ? 1 : 0;  // fc2's weight splits its input features
    INFO("step " << i / 3 << ", gradient " << i % 3);
    CHECK(torch::equal(got[i], accel::detail::tp::slice_of(expected[i], dimension, 1, rank, tp)));
  }
  CHECK(acc.parallel().all_reduces().amax_all_reduces == 2 * amax_all_reduces_per_step);
}

}  // namespace

TEST_CASE(
    "mesh: fp8 computes tensor-parallel layers in float8 with the whole tensors' scales: each process's gradients are "
    "its slices of one process's, bit for bit",
    "[tp_fp8]") {
  // Tensorwise: per step fc1's weight (forward) and output gradient (backward), fc2's input and weight (forward).
  check_fp8_beside_tp<accel::tensorwise_scaling>(4);
  // Delayed: the scales come from the amaxes maxed over every process at each step; no cast reduces.
  check_fp8_beside_tp<accel::delayed_scaling>(0);
}

namespace {

/// fp8_pair's output under the precision's and the parallel policy's forward scopes, as `model(x)` computes it
/// before returning it in float32, on process 0's weights: split as mlp_plan says, or whole.
template <bool Split, class Accelerator>
torch::Tensor fp8_pair_output(Accelerator& acc) {
  torch::manual_seed(acc.process_index() == 0 ? 41 : 410 + acc.process_index());
  fp8_pair net;
  if constexpr (Split) accel::parallelize_module(acc, net, mlp_plan);
  auto model = acc.prepare(net);
  const auto x = torch::randn({24, 32}, at::make_generator<at::CPUGeneratorImpl>(800));
  [[maybe_unused]] auto autocast = acc.autocast();
  [[maybe_unused]] auto split_layers = acc.parallel().forward_scope();
  return model->forward(x);
}

/// The row-parallel fc2 adds its bias after the partial products' sum: the output stays in the compute type, as the
/// whole layer's is (autocast's addmm, fp8's float8 matmul), instead of a float32 bias promoting it.
template <class Precision>
void check_row_parallel_output_type() {
  auto alone_options = every_linear_in_fp8();
  alone_options.parallelism_config = {.dp_replicate_size = 1, .dp_shard_size = 1, .tp_size = 1, .cp_size = 1};
  accel::accelerator<Precision> one_process(alone_options);
  const torch::Tensor expected = fp8_pair_output<false>(one_process);
  accel::accelerator<Precision, tp_policy> acc(every_linear_in_fp8());
  const torch::Tensor got = fp8_pair_output<true>(acc);
  INFO(Precision::name());
  REQUIRE(expected.scalar_type() == torch::kBFloat16);
  CHECK(got.scalar_type() == torch::kBFloat16);
  // The partial products are rounded to bfloat16 before their sum: a few of its steps apart, not bit for bit.
  CHECK((got.to(torch::kFloat) - expected.to(torch::kFloat)).abs().max().item<float>() <=
        0.05f * expected.abs().max().item<float>());
}

}  // namespace

TEST_CASE(
    "mesh: a row-parallel layer's output, its bias added after the sum, is in the compute type, as one "
    "process's is",
    "[tp_fp8]") {
  check_row_parallel_output_type<accel::bf16>();
  check_row_parallel_output_type<accel::fp8<>>();
}

// Fully sharded data parallelism beside tensor parallelism (accel/fully_sharded_tensor_parallel.hpp), as `accel
// launch --parallelism_config_dp_shard_size 2 --parallelism_config_tp_size 2` starts it on 4 processes
// (mesh.fsdp_tp.* in tests/CMakeLists.txt): each tp rank's slices sharded over its dp_shard group.

namespace {

using fsdp_tp_policy = accel::fully_sharded_tensor_parallel<accel::gloo>;
using hsdp_tp_policy = accel::hybrid_sharded_tensor_parallel<accel::gloo>;

/// The tp-local numbers of elements of `net`'s trainable parameters in its order (the reducer's), from the shard
/// layout (the parameters themselves hold this process's slice between steps).
std::vector<std::int64_t> tp_local_sizes(torch::nn::Module& net, const accel::detail::owned_shards& shards) {
  std::vector<std::int64_t> sizes;
  for (const auto& p : net.parameters()) {
    const auto shard = shards.shard_of(p);
    REQUIRE(shard.has_value());
    std::int64_t numel = 1;
    for (const auto size : shard->sizes) numel *= size;
    sizes.push_back(numel);
  }
  return sizes;
}

}  // namespace

namespace {

/// Under `Policy` (fully_sharded_tensor_parallel or hybrid_sharded_tensor_parallel), char_lm's transformer trains as
/// one process on the whole batch within 1e-5 over 50 steps; per step the tp all-reduces are tensor_parallel's, the
/// dp_shard group's all-gathers and reduce-scatters and the dp_replicate group's all-reduces are counted against
/// their formulas.
template <class Policy>
void check_sharded_tp_parity() {
  accel::accelerator<accel::fp32, Policy> acc;
  const int tp = acc.parallel().mesh().layout().size("tp");
  const int R = acc.parallel().mesh().layout().sizes().dp_replicate;
  const auto expected = train_char_transformer_alone(acc.num_processes() / tp);
  auto net = split_char_transformer(acc, char_transformer_plan());
  std::uint64_t gathers = 0, gathered = 0, scatters = 0, scattered = 0, replicated = 0;
  int step = 0;
  const auto tp_counts = [](const accel::tensor_parallel_counts& before, const accel::tensor_parallel_counts& after) {
    CHECK(after.forward_all_reduces - before.forward_all_reduces == 1 + 2 * 2);  // tensor_parallel's, unchanged
    CHECK(after.backward_all_reduces - before.backward_all_reduces == 2 * 2 + 1);
  };
  const auto dp_shard_counts = [&](auto& trained, torch::nn::Module& module, torch::optim::Optimizer& sgd) {
    const auto* shards = trained.parallel().shards_of(sgd);
    const auto* reducer = trained.parallel().reducer_for(module);
    REQUIRE(shards != nullptr);
    REQUIRE(reducer != nullptr);
    const int S = trained.parallel().mesh().layout().size("dp_shard");
    // Each bucket's reduce-scatter in the dp_shard group carries S segments: its members' padded chunks of their tp
    // slices, and a flag each (tests/distributed/test_sharded.cpp's formula, on the tp-local sizes).
    const auto sizes = tp_local_sizes(module, *shards);
    std::uint64_t segments = 0;
    for (const auto& bucket : reducer->bucket_layout()) {
      for (const auto member : bucket)
        segments += static_cast<std::uint64_t>(accel::detail::shard_chunk(sizes[member], S));
      segments += bucket.size();
    }
    INFO("step " << step << ": all-gathers " << shards->all_gather_count() << ", reduce-scatters "
                 << reducer->reduce_scatter_count() << ", elements across dp_replicate "
                 << reducer->replica_elements());
    // Per step, within dp_shard: one all-gather per gather bucket before the forward (no shard units), one
    // reduce-scatter per gradient bucket in backward; the tp all-reduces are tp_counts', unchanged.
    CHECK(shards->all_gather_count() - gathers == shards->bucket_count());
    CHECK(shards->all_gathered_elements() - gathered == static_cast<std::uint64_t>(shards->gather_payload_elements()));
    CHECK(reducer->reduce_scatter_count() - scatters == reducer->bucket_layout().size());
    CHECK(reducer->payload_elements() - scattered == segments * static_cast<std::uint64_t>(S));
    // Across dp_replicate (hybrid_sharded's rule): each bucket's reduced segment all-reduced once, none without it.
    CHECK(reducer->replica_elements() - replicated == (R > 1 ? segments : 0));
    gathers = shards->all_gather_count();
    gathered = shards->all_gathered_elements();
    scatters = reducer->reduce_scatter_count();
    scattered = reducer->payload_elements();
    replicated = reducer->replica_elements();
    ++step;
  };
  check_within_1e5(train_split(acc, net, tp_counts, dp_shard_counts), expected);
  CHECK(step == steps);
}

/// Under `Policy`, an MLP trains and clips (AdamW) as one process on the whole batch, each process holding 1/dp_shard
/// of its tp slices' state; the sharded checkpoint format and fp8's float8 all-gather are refused.
template <class Policy>
void check_sharded_tp_state() {
  using Catch::Matchers::Contains;
  const auto policy = Policy::name().substr(0, Policy::name().find('<'));
  CHECK_THROWS_WITH(Policy(accel::options{.sharding = {.state_dict = accel::state_dict_type::sharded}}),
                    Contains(policy) && Contains("leave it at state_dict_type::full"));
  {
    accel::options gathered_in_float8;
    gathered_in_float8.fp8.enable_fsdp_float8_all_gather = true;
    accel::accelerator<accel::fp8<>, Policy> fp8_acc(gathered_in_float8);
    mlp net;
    accel::parallelize_module(fp8_acc, net, mlp_plan);
    CHECK_THROWS_WITH(fp8_acc.prepare(net), Contains(policy) && Contains("enable_fsdp_float8_all_gather is not built "
                                                                         "beside tensor parallelism"));
  }
  accel::accelerator<accel::fp32, Policy> acc;
  const auto& layout = acc.parallel().mesh().layout();
  const int tp = layout.size("tp"), S = layout.size("dp_shard"), R = layout.sizes().dp_replicate;
  const auto expected = train_alone(R * S);
  torch::manual_seed(acc.process_index() == 0 ? 3 : 17 + acc.process_index());
  mlp net;
  accel::parallelize_module(acc, net, mlp_plan);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
  std::vector<std::int64_t> local_sizes = sizes_of(net->parameters());  // the tp slices, before sharding
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < steps * R * S; ++i) batches.push_back(batch(i));
  auto [model, opt, data] = acc.prepare(net, optimizer, batches);
  run got;
  for (const auto& [x, y] : data) {
    acc.backward(torch::mse_loss(model(x), y));
    got.norms.push_back(acc.clip_grad_norm_(model->parameters(), max_norm));
    opt.step();
    opt.zero_grad();
  }
  REQUIRE(got.norms.size() == static_cast<std::size_t>(steps));
  // Clipping is global over tp and dp_shard: each step's norm is the whole model's.
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s);
    CHECK(std::abs(got.norms[s] - expected.norms[s]) <= 1e-5 * expected.norms[s]);
  }
  for (auto& [name, tensor] : acc.get_state_dict(model)) got.parameters.push_back(tensor);
  REQUIRE(got.parameters.size() == expected.parameters.size());
  for (std::size_t i = 0; i < got.parameters.size(); ++i) {
    INFO("parameter " << i);
    CHECK(got.parameters[i].sizes() == expected.parameters[i].sizes());
    CHECK((got.parameters[i] - expected.parameters[i]).abs().max().item<double>() <= 1e-5);
  }
  // The state bytes: AdamW's two moments on this process's shard of each tp slice, 1/S of the slice (its padded
  // chunk, the last shard less), and the dp_shard group's shards add up to the tp slices, once.
  std::int64_t state_bytes = 0, local_elements = 0, chunks = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& adamw = static_cast<const torch::optim::AdamWParamState&>(*state);
    state_bytes += static_cast<std::int64_t>(adamw.exp_avg().nbytes() + adamw.exp_avg_sq().nbytes());
  }
  for (const auto numel : local_sizes) {
    local_elements += numel;
    chunks += accel::detail::shard_chunk(numel, S);
  }
  INFO("process " << acc.process_index() << ": state " << state_bytes << " B of the tp slices' " << 8 * local_elements
                  << " B, dp_shard = " << S << ", tp = " << tp);
  CHECK(state_bytes <= 8 * chunks);
  CHECK(state_bytes < 8 * local_elements);
  auto group_total = torch::tensor({static_cast<double>(state_bytes)}, torch::kDouble);
  acc.parallel().mesh().group("dp_shard").all_reduce(group_total, accel::reduction::sum).wait();
  CHECK(group_total.item<double>() == static_cast<double>(8 * local_elements));
}

}  // namespace

TEST_CASE(
    "mesh: fully_sharded_tensor_parallel trains char_lm's transformer as one process on the whole batch, "
    "within 1e-5 over 50 steps, with dp_shard's collectives counted",
    "[fsdp_tp][fsdp_tp_parity]") {
  check_sharded_tp_parity<fsdp_tp_policy>();
}

TEST_CASE(
    "mesh: fully_sharded_tensor_parallel trains and clips an MLP as one process, holding 1/dp_shard of the tp "
    "slices' state",
    "[fsdp_tp][fsdp_tp_state]") {
  check_sharded_tp_state<fsdp_tp_policy>();
}

TEST_CASE(
    "mesh: hybrid_sharded_tensor_parallel (dp_replicate x dp_shard x tp) trains char_lm's transformer as one process "
    "on the whole batch, within 1e-5 over 50 steps, with dp_shard's and dp_replicate's collectives counted",
    "[hsdp_tp][hsdp_tp_parity]") {
  check_sharded_tp_parity<hsdp_tp_policy>();
}

TEST_CASE(
    "mesh: hybrid_sharded_tensor_parallel trains and clips an MLP as one process, holding 1/dp_shard of the tp "
    "slices' state",
    "[hsdp_tp][hsdp_tp_state]") {
  check_sharded_tp_state<hsdp_tp_policy>();
}

TEST_CASE(
    "mesh: fully_sharded_tensor_parallel and hybrid_sharded_tensor_parallel refuse a mesh without dp_shard, and "
    "a dp_replicate dimension the one lacks and the other needs, naming the fix",
    "[tp][tp_refusals]") {
  using Catch::Matchers::Contains;
  // This job (tp = 2 on 2 processes) has no dp_shard dimension.
  CHECK_THROWS_WITH(fsdp_tp_policy(accel::options{}),
                    Contains("accel::fully_sharded_tensor_parallel") && Contains("no dp_shard or cp dimension") &&
                        Contains("--parallelism_config_dp_shard_size D") && Contains("use accel::tensor_parallel"));
  CHECK_THROWS_WITH(hsdp_tp_policy(accel::options{}),
                    Contains("accel::hybrid_sharded_tensor_parallel") && Contains("no dp_shard or cp dimension"));
  using accel::detail::tp::check_sharded_beside_tp, accel::detail::tp::shard_replicas;
  const accel::mesh_layout three_d({.dp_replicate = 2, .dp_shard = 2, .tp = 2}, 8);
  const accel::mesh_layout two_d({.dp_shard = 2, .tp = 2}, 4);
  CHECK_THROWS_WITH(check_sharded_beside_tp(three_d, "accel::fully_sharded_tensor_parallel", shard_replicas::none),
                    Contains("dp_replicate above 1") && Contains("use accel::hybrid_sharded_tensor_parallel"));
  CHECK_THROWS_WITH(
      check_sharded_beside_tp(two_d, "accel::hybrid_sharded_tensor_parallel", shard_replicas::across_dp_replicate),
      Contains("no dp_replicate dimension") && Contains("--parallelism_config_dp_replicate_size R") &&
          Contains("use accel::fully_sharded_tensor_parallel"));
  CHECK_NOTHROW(check_sharded_beside_tp(two_d, "accel::fully_sharded_tensor_parallel", shard_replicas::none));
  CHECK_NOTHROW(
      check_sharded_beside_tp(three_d, "accel::hybrid_sharded_tensor_parallel", shard_replicas::across_dp_replicate));
  CHECK_THROWS_WITH(accel::detail::tp::tensor_parallel_mesh(std::nullopt, 2, "accel::fully_sharded_tensor_parallel"),
                    Contains("accel::fully_sharded_tensor_parallel: the mesh has no tp dimension"));
}

namespace {

using fsdp_tp_accelerator = accel::accelerator<accel::fp32, fsdp_tp_policy>;

/// A checkpoint directory the jobs of mesh.tp.fsdp_* share (tests/CMakeLists.txt sets where).
std::filesystem::path fsdp_tp_checkpoint(const std::string& name) { return tp_checkpoint().parent_path() / name; }

/// What checkpoint `dir` holds: its whole weights in the file's order, and AdamW's state as the language model's
/// optimizer loads it from `optimizer.bin`.
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> checkpoint_contents(
    const std::filesystem::path& dir) {
  std::vector<torch::Tensor> weights;
  for (auto& [name, tensor] : accel::safetensors::load(dir / "model.safetensors")) weights.push_back(tensor);
  lm net;
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
  return {weights, accel_test::adamw_state(optimizer, dir / "optimizer.bin")};
}

/// Under `Accelerator`, the language model (starting elsewhere) loads checkpoint `from` and saves it again to `to`,
/// nothing trained between: what the files hold must cross the mesh unchanged. The saving job's objects are
/// prepared: the model, its optimizer and its batches.
template <class Accelerator>
void load_and_save(const std::filesystem::path& from, const std::filesystem::path& to) {
  Accelerator acc;
  torch::manual_seed(99);
  lm net;
  if constexpr (!std::is_same_v<typename Accelerator::parallel_type, accel::single_process>)
    accel::parallelize_module(acc, net, lm_plan);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < 2 * saved_at; ++i) batches.push_back(tokens(i));
  auto [model, opt, data] = acc.prepare(net, optimizer, batches);
  acc.load_state(from);
  acc.save_state(to);
}

/// Checkpoint `again` holds what `original` does, bit for bit.
void check_same_checkpoint(const std::filesystem::path& original, const std::filesystem::path& again) {
  const auto [weights, state] = checkpoint_contents(original);
  const auto [weights_again, state_again] = checkpoint_contents(again);
  const auto parameters = lm()->parameters().size();
  CHECK(weights.size() == parameters);
  CHECK(state.size() == 3 * parameters);  // each parameter's exp_avg, exp_avg_sq and step
  CHECK(accel_test::all_equal(weights, weights_again));
  CHECK(accel_test::all_equal(state, state_again));
}

}  // namespace

namespace {

/// Under `Accelerator` (sharding beside tp on `dp` dp ranks), the language model trained `saved_at` steps equals one
/// process on the whole batch within 1e-5 and is saved to checkpoint `name`, whose weights are get_state_dict's; the
/// same job loads it and saves it again, bit for bit.
template <class Accelerator>
void check_sharded_tp_save(const std::string& name, int dp) {
  const auto dir = fsdp_tp_checkpoint(name);
  const std::vector<torch::Tensor> got = train_lm<Accelerator>(0, dp * saved_at, {}, dir);  // saved_at steps
  const auto expected = train_lm_alone(dp, saved_at);
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("parameter " << i);
    CHECK((got[i] - expected[i]).abs().max().item<double>() <= 1e-5);
  }
  const auto [weights, state] = checkpoint_contents(dir);
  REQUIRE(weights.size() == got.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(torch::equal(weights[i], got[i]));  // whole, as get_state_dict's
  const auto again = fsdp_tp_checkpoint(name + "_again");
  load_and_save<Accelerator>(dir, again);
  check_same_checkpoint(dir, again);
}

}  // namespace

TEST_CASE(
    "mesh: fully_sharded_tensor_parallel saves whole weights and optimizer state at dp_shard 2 x tp 2, and "
    "loads them back bit for bit",
    "[fsdp_tp_save]") {
  check_sharded_tp_save<fsdp_tp_accelerator>("fsdp_tp_2x2", 2);
}

TEST_CASE(
    "mesh: hybrid_sharded_tensor_parallel saves whole weights and optimizer state at dp_replicate 2 x dp_shard 2 x "
    "tp 2, and loads them back bit for bit",
    "[hsdp_tp_save]") {
  check_sharded_tp_save<accel::accelerator<accel::fp32, hsdp_tp_policy>>("hsdp_tp_2x2x2", 4);
}

TEST_CASE(
    "mesh: a checkpoint saved at dp_replicate 2 x dp_shard 2 x tp 2 loads at dp_shard 2 x tp 2 and on one "
    "process, bit for bit",
    "[hsdp_tp_load]") {
  const auto dir = fsdp_tp_checkpoint("hsdp_tp_2x2x2");
  const bool split = std::getenv("PARALLELISM_CONFIG_TP_SIZE") != nullptr;
  const auto again = fsdp_tp_checkpoint(split ? "hsdp_tp_loaded_2x2" : "hsdp_tp_loaded_1");
  if (split)
    load_and_save<fsdp_tp_accelerator>(dir, again);
  else
    load_and_save<accel::accelerator<accel::fp32>>(dir, again);
  check_same_checkpoint(dir, again);
}

TEST_CASE("mesh: a checkpoint saved at dp_shard 2 x tp 2 loads at tp = 2 and on one process, bit for bit",
          "[fsdp_tp_load]") {
  const auto dir = fsdp_tp_checkpoint("fsdp_tp_2x2");
  const char* tp = std::getenv("PARALLELISM_CONFIG_TP_SIZE");
  const bool split = tp != nullptr && std::string(tp) != "1";
  const auto again = fsdp_tp_checkpoint(split ? "fsdp_tp_loaded_tp" + std::string(tp) : "fsdp_tp_loaded_1");
  if (split)
    load_and_save<tp_accelerator>(dir, again);
  else
    load_and_save<accel::accelerator<accel::fp32>>(dir, again);
  check_same_checkpoint(dir, again);
}
