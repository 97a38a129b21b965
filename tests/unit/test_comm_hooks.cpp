// Gradient communication hooks (accel/detail/gradient_sync/comm_hooks.hpp), the pieces that need no second process: the
// random draws against NumPy's and PyTorch's (numbers printed by the .venv's Python, given with each case), PyTorch's
// orthogonalisation and compression rule, the refused settings, and each hook on one process (whose all-reduce is the
// identity). tests/scripts/check_comm_hooks.py compares them with PyTorch's DDP on 2 processes.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "support.hpp"

namespace {

using accel::detail::bucket_contents;
using local_hook = std::unique_ptr<accel::detail::bucket_hook<accel::local_communicator>>;

/// A bucket as the reducer hands it over: `members`' values one after the other, then a flag of 1 per member.
bucket_contents make_bucket(const std::vector<torch::Tensor>& members, std::size_t index = 0, std::size_t count = 1) {
  std::int64_t elements = 0;
  for (const auto& m : members) elements += m.numel();
  const auto flags = static_cast<std::int64_t>(members.size());
  bucket_contents bucket{.index = index,
                         .count = count,
                         .flat = torch::empty({elements + flags}),
                         .gradients = {},
                         .flags = {},
                         .members = {}};
  bucket.gradients = bucket.flat.narrow(0, 0, elements);
  bucket.flags = bucket.flat.narrow(0, elements, flags).fill_(1);
  std::int64_t offset = 0;
  for (const auto& m : members) {
    bucket.members.push_back(bucket.flat.narrow(0, offset, m.numel()).view(m.sizes()).copy_(m));
    offset += m.numel();
  }
  return bucket;
}

void reduce(local_hook& hook, const bucket_contents& bucket) {
  accel::local_communicator comm;
  hook->launch(comm, bucket).wait();
}

/// The (rank + 1)-th singular value of `matrix` over its first: ~0 when its rank is at most `rank`.
double rank_ratio(const torch::Tensor& matrix, std::int64_t rank) {
  const auto values = torch::linalg_svdvals(matrix.to(torch::kDouble));
  return (values[rank] / values[0]).item<double>();
}

std::vector<float> values_of(const torch::Tensor& t) {
  const auto flat = t.to(torch::kFloat).contiguous().view(-1);
  return {flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel()};
}

void check_close(const torch::Tensor& actual, const std::vector<float>& expected, double tolerance = 1e-6) {
  const auto values = values_of(actual);
  REQUIRE(values.size() == expected.size());
  for (std::size_t i = 0; i < values.size(); ++i) CHECK(values[i] == Approx(expected[i]).margin(tolerance));
}

}  // namespace

TEST_CASE("PowerSGD's seeds are NumPy's RandomState(seed).randint draws, as PyTorch's PowerSGDState draws them") {
  // np.random.RandomState(s); [r.randint(1_000_000_000) for _ in range(n)], numpy from the .venv.
  const auto draws = [](std::uint32_t seed, int n, std::uint64_t high = 1'000'000'000) {
    accel::detail::legacy_random_state state(seed);
    std::vector<std::uint32_t> out;
    for (int i = 0; i < n; ++i) out.push_back(state.randint(high));
    return out;
  };
  CHECK(draws(0, 4) == std::vector<std::uint32_t>{209652396, 398764591, 924231285, 404868288});
  CHECK(draws(42, 3) == std::vector<std::uint32_t>{534895718, 199900595, 862061404});
  CHECK(draws(4294967295u, 3) == std::vector<std::uint32_t>{419326371, 479346978, 697429004});
  // Other bounds: 2^32 takes the raw 32-bit output; 10 masks to 4 bits and redraws above 9.
  CHECK(draws(0, 2, std::uint64_t{1} << 32) == std::vector<std::uint32_t>{2357136044u, 2546248239u});
  CHECK(draws(5, 8, 10) == std::vector<std::uint32_t>{3, 6, 6, 0, 9, 8, 4, 7});
  // randint(1) is 0 without a draw: RandomState(0).randint(1), then randint(1_000_000_000) gives 209652396.
  accel::detail::legacy_random_state state(0);
  CHECK(state.randint(1) == 0);
  CHECK(state.randint(1'000'000'000) == 209652396);
  CHECK_THROWS_WITH(state.randint(0), Catch::Contains("[1, 2^32]"));
}

TEST_CASE("PowerSGD's random Qs are PyTorch's: manual_seed(seed), then randn of each Q in turn, on the CPU") {
  // torch.manual_seed(209652396); a = torch.randn(1, 4, 2); b = torch.randn(1, 3, 2)
  auto qa = torch::empty({1, 4, 2});
  auto qb = torch::empty({1, 3, 2});
  torch::manual_seed(5);
  const auto untouched = torch::randn({3});
  torch::manual_seed(5);
  accel::detail::fill_normal({qa, qb}, 209652396);
  check_close(qa, {-0.8103023767471313f, 0.41339945793151855f, -1.2778252363204956f, 0.3302519619464874f,
                   0.33864617347717285f, -0.6434366703033447f, -0.9755873084068298f, -0.9591677188873291f});
  check_close(qb, {0.07438430190086365f, 1.4682914018630981f, -1.8973177671432495f, 0.3486916720867157f,
                   -0.5368818044662476f, -0.8757835030555725f});
  CHECK(torch::equal(torch::randn({3}), untouched));  // the default generator is left alone, as fork_rng does
}

TEST_CASE("orthogonalize is PyTorch's _orthogonalize: Gram-Schmidt up to rank 2 and in float16, QR above") {
  // m = torch.tensor([[3., 1., 2.], [1., 0., -1.], [2., 2., 0.], [0., 1., 1.]]).view(1, 4, 3), then
  // powerSGD_hook._orthogonalize on m[:, :, :2], on m, on m[:, :, :2] with epsilon 0.1, and on m.half().
  const auto m = torch::tensor({3.f, 1.f, 2.f, 1.f, 0.f, -1.f, 2.f, 2.f, 0.f, 0.f, 1.f, 1.f}).view({1, 4, 3});
  auto two = m.narrow(2, 0, 2).clone();
  accel::detail::orthogonalize(two, 0);
  check_close(two, {0.8017836809158325f, -0.31622767448425293f, 0.26726123690605164f, -0.3162277340888977f,
                    0.5345224738121033f, 0.6324555277824402f, 0.0f, 0.6324555277824402f});
  auto three = m.clone();
  accel::detail::orthogonalize(three, 0);
  check_close(three, {-0.8017838001251221f, -0.3162277936935425f, 0.5070925354957581f, -0.267261266708374f,
                      -0.31622785329818726f, -0.6197797656059265f, -0.534522533416748f, 0.6324555277824402f,
                      -0.45074892044067383f, 0.0f, 0.632455587387085f, 0.3944052755832672f});
  auto with_epsilon = m.narrow(2, 0, 2).clone();
  accel::detail::orthogonalize(with_epsilon, 0.1);
  check_close(with_epsilon, {0.7809129357337952f, -0.2511344254016876f, 0.2603043019771576f, -0.2816460430622101f,
                             0.5206086039543152f, 0.6243152618408203f, 0.0f, 0.5938036441802979f});
  auto half = m.to(torch::kHalf);
  accel::detail::orthogonalize(half, 0);
  check_close(half, {0.8017578125f, -0.316162109375f, 0.5068359375f, 0.267333984375f, -0.316162109375f, -0.61962890625f,
                     0.53466796875f, 0.63232421875f, -0.450439453125f, 0.0f, 0.63232421875f, 0.39404296875f});
  // PyTorch divides a column of zeros by its zero norm into NaN; it stays zeros here, as PyTorch's code means.
  auto zeros = torch::zeros({1, 3, 1});
  accel::detail::orthogonalize(zeros, 0);
  CHECK(torch::equal(zeros, torch::zeros({1, 3, 1})));
}

TEST_CASE("PowerSGD compresses a matrix only when that saves more than min_compression_rate, as _should_compress") {
  using accel::detail::worth_compressing;
  // powerSGD_hook._should_compress(rows, columns, rank, rate)[0] for each.
  CHECK(worth_compressing(64, 32, 1, 2));
  CHECK_FALSE(worth_compressing(4, 64, 2, 2));  // (4 + 64) * 2 * 2 = 272 elements sent for 256
  CHECK(worth_compressing(4, 64, 1, 2));
  CHECK_FALSE(worth_compressing(4, 4, 1, 2));  // 16 for 16: not less
  CHECK(worth_compressing(4, 4, 1, 1.99));
  CHECK(worth_compressing(1, 64, 1, 0.5));
}

TEST_CASE("bad PowerSGD settings are refused at construction, with the fix, and sharded gradients refuse any hook") {
  using Catch::Contains;
  using accelerator = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
  const auto with = [](accel::power_sgd_options settings, accel::comm_hook hook = accel::comm_hook::power_sgd) {
    return accel::options{.comm_hook = {.hook = hook, .wrapper = accel::comm_wrapper::none, .power_sgd = settings}};
  };
  // PyTorch's PowerSGDState check: start_powerSGD_iter > 1 with error feedback or warm start.
  CHECK_THROWS_WITH(accelerator(with({.start_power_sgd_iter = 1})),
                    Contains("start_power_sgd_iter is 1") && Contains("must be > 1") && Contains("set it to 2"));
  CHECK_THROWS_WITH(accelerator(with({.start_power_sgd_iter = 0, .use_error_feedback = false})),
                    Contains("start_power_sgd_iter is 0"));
  CHECK_NOTHROW(accelerator(with({.start_power_sgd_iter = 1, .use_error_feedback = false, .warm_start = false})));
  CHECK_THROWS_WITH(accelerator(with({.matrix_approximation_rank = 0}, accel::comm_hook::batched_power_sgd)),
                    Contains("matrix_approximation_rank is 0") && Contains("at least 1"));
  CHECK_THROWS_WITH(accelerator(with({.random_seed = std::uint64_t{1} << 32})),
                    Contains("random_seed is 4294967296") && Contains("below 2^32"));
  CHECK_THROWS_WITH(accelerator(with({.orthogonalization_epsilon = -1e-8})),
                    Contains("orthogonalization_epsilon is") && Contains(">= 0"));
  // The PowerSGD settings are not read by the other hooks (Accelerate passes comm_state_option only to PowerSGD).
  CHECK_NOTHROW(accelerator(with({.start_power_sgd_iter = 0}, accel::comm_hook::fp16)));
  CHECK_THROWS_WITH((accel::accelerator<accel::fp32, accel::zero2<accel::gloo>>(with({}, accel::comm_hook::bf16))),
                    Contains("zero2 and fully_sharded reduce-scatter"));
  // bfloat16 on Gloo: LibTorch 2.13's sums it, 1.13's fails in the all-reduce ("Invalid scalar type"): refused there.
  const accel::options bf16_wrapper{.comm_hook = {.hook = accel::comm_hook::power_sgd,
                                                  .wrapper = accel::comm_wrapper::bf16,
                                                  .power_sgd = {.start_power_sgd_iter = 2}}};
  if (accel::detail::compat::gloo_sums_bfloat16)
    CHECK_NOTHROW(accelerator(bf16_wrapper));
  else
    CHECK_THROWS_WITH(accelerator(bf16_wrapper),
                      Contains("bfloat16 all-reduces, which this LibTorch's Gloo cannot sum") && Contains("fp16"));
  // Issue 40, item 5: PowerSGD in the fp16 wrapper multiplies float16 matrices on the CPU, which LibTorch 1.13 cannot
  // (it failed after start_power_sgd_iter steps, on every process): refused at construction there, as bf16 is.
  const accel::options fp16_wrapper{.comm_hook = {.hook = accel::comm_hook::power_sgd,
                                                  .wrapper = accel::comm_wrapper::fp16,
                                                  .power_sgd = {.start_power_sgd_iter = 2}}};
  auto batched_fp16_wrapper = fp16_wrapper;
  batched_fp16_wrapper.comm_hook.hook = accel::comm_hook::batched_power_sgd;
  if (accel::detail::compat::cpu_multiplies_float16) {
    CHECK_NOTHROW(accelerator(fp16_wrapper));
    CHECK_NOTHROW(accelerator(batched_fp16_wrapper));
  } else {
    CHECK_THROWS_WITH(accelerator(fp16_wrapper), Contains("comm_wrapper::fp16") &&
                                                     Contains("\"addmm_impl_cpu_\" not implemented for 'Half'") &&
                                                     Contains("use PowerSGD without the wrapper"));
    CHECK_THROWS_WITH(accelerator(batched_fp16_wrapper), Contains("comm_wrapper::fp16"));
  }
  CHECK_NOTHROW(accelerator(accel::options{.comm_hook = {.hook = accel::comm_hook::fp16}}));
}

TEST_CASE("compat::cpu_multiplies_float16 is this LibTorch's: a float16 matrix product on the CPU works exactly then") {
  const auto a = torch::ones({2, 3}, torch::kHalf), b = torch::ones({3, 2}, torch::kHalf);
  if (accel::detail::compat::cpu_multiplies_float16)
    CHECK(torch::equal(torch::mm(a, b), torch::full({2, 2}, 3, torch::kHalf)));
  else
    CHECK_THROWS_WITH(torch::mm(a, b), Catch::Contains("not implemented for 'Half'"));
}

TEST_CASE("the fp16 and bf16 hooks send the bucket cast, half the bytes, flags exact, and so does a wrapper alone") {
  torch::manual_seed(3);
  const auto gradient = torch::randn({5, 3}) * 1e-3;
  for (const auto& [options, type] :
       {std::pair{accel::comm_hook_options{.hook = accel::comm_hook::fp16}, torch::kHalf},
        std::pair{accel::comm_hook_options{.hook = accel::comm_hook::bf16}, torch::kBFloat16},
        std::pair{accel::comm_hook_options{.wrapper = accel::comm_wrapper::fp16}, torch::kHalf},
        std::pair{accel::comm_hook_options{.hook = accel::comm_hook::fp16, .wrapper = accel::comm_wrapper::bf16},
                  torch::kHalf}}) {
    auto hook = accel::detail::make_bucket_hook<accel::local_communicator>(options);
    REQUIRE(hook);
    const auto bucket = make_bucket({gradient});
    reduce(hook, bucket);
    auto expected = gradient.to(type);
    if (options.wrapper == accel::comm_wrapper::bf16) expected = gradient.to(torch::kBFloat16).to(type);
    CHECK(torch::equal(bucket.members[0], expected.to(torch::kFloat)));
    CHECK(bucket.flags.item<float>() == 1);
    CHECK(hook->communicated_bytes() == 16 * 2);  // 15 values and a flag, 2 bytes each
  }
  CHECK_FALSE(accel::detail::make_bucket_hook<accel::local_communicator>({}));
}

TEST_CASE(
    "PowerSGD on one process: the plain all-reduce until start, steps counted at the last bucket, then low rank "
    "with error feedback") {
  torch::manual_seed(4);
  accel::comm_hook_options options{.hook = accel::comm_hook::power_sgd,
                                   .power_sgd = {.matrix_approximation_rank = 1, .start_power_sgd_iter = 2}};
  auto hook = accel::detail::make_bucket_hook<accel::local_communicator>(options);
  // Two buckets a step: if every bucket counted a step, compression would start at the second step.
  const auto step = [&](const torch::Tensor& weight, const torch::Tensor& bias) {
    std::vector<bucket_contents> buckets{make_bucket({weight, bias}, 0, 2), make_bucket({weight, bias}, 1, 2)};
    for (auto& b : buckets) reduce(hook, b);
    return buckets;
  };
  const auto weight = torch::randn({8, 6});
  const auto bias = torch::randn({8});
  for (int plain = 0; plain < 2; ++plain)
    for (const auto& b : step(weight, bias)) {
      CHECK(torch::equal(b.members[0], weight));
      CHECK(torch::equal(b.members[1], bias));
    }
  CHECK(hook->communicated_bytes() == 2 * 2 * (48 + 8 + 2) * 4);
  const auto compressed = step(weight, bias);
  for (const auto& b : compressed) {
    CHECK(rank_ratio(b.members[0], 1) < 1e-5);
    CHECK_FALSE(torch::allclose(b.members[0], weight, 1e-2, 1e-2));
    CHECK(torch::allclose(b.members[1], bias));  // a vector is not worth compressing: sent whole
    CHECK(torch::equal(b.flags, torch::ones({2})));
  }
  // Per bucket: the bias, 2 flags and P (8 x 1) in one all-reduce, then Q (6 x 1).
  CHECK(hook->communicated_bytes() == 2 * 2 * (48 + 8 + 2) * 4 + 2 * (8 + 2 + 8 + 6) * 4);
  // Zero gradients next: what comes out is the approximation of the error the last step left (error feedback).
  const auto error = weight - compressed[0].members[0];
  const auto feedback = step(torch::zeros({8, 6}), torch::zeros({8}));
  CHECK(feedback[0].members[0].abs().max().item<float>() > 0.1 * error.abs().max().item<float>());
  CHECK(torch::allclose(feedback[0].members[1], torch::zeros({8}), 0, 1e-6));

  // Without error feedback, zeros stay zeros: P is a column of zeros, which orthogonalisation keeps (not NaN).
  options.power_sgd.use_error_feedback = false;
  hook = accel::detail::make_bucket_hook<accel::local_communicator>(options);
  for (int i = 0; i < 3; ++i) step(weight, bias);
  for (const auto& b : step(torch::zeros({8, 6}), torch::zeros({8})))
    CHECK(torch::equal(b.members[0], torch::zeros({8, 6})));
}

TEST_CASE("batched PowerSGD on one process: the bucket's gradients as one square matrix of rank r, flags exact") {
  torch::manual_seed(6);
  auto hook = accel::detail::make_bucket_hook<accel::local_communicator>(
      {.hook = accel::comm_hook::batched_power_sgd,
       .power_sgd = {.matrix_approximation_rank = 2, .start_power_sgd_iter = 2}});
  const auto weight = torch::randn({6, 5});  // with the bias, 36 values: a 6 x 6 square without padding
  const auto bias = torch::randn({6});
  for (int i = 0; i < 2; ++i) reduce(hook, make_bucket({weight, bias}));
  const auto bucket = make_bucket({weight, bias});
  reduce(hook, bucket);
  CHECK(rank_ratio(bucket.gradients.view({6, 6}), 2) < 1e-5);
  CHECK_FALSE(torch::allclose(bucket.gradients, torch::cat({weight.view(-1), bias}), 1e-2, 1e-2));
  CHECK(torch::equal(bucket.flags, torch::ones({2})));
  // Plain: 2 steps of 36 values and 2 flags; compressed: the flags and P (6 x 2), then Q (6 x 2).
  CHECK(hook->communicated_bytes() == (2 * 38 + 2 + 12 + 12) * 4);
}
