/// \file
/// What comm_hooks.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../comm_hooks.hpp"

#include <random>

namespace accel::detail {

bucket_contents cast_bucket(const bucket_contents& bucket, at::ScalarType dtype) {
  bucket_contents cast{.index = bucket.index,
                       .count = bucket.count,
                       .flat = bucket.flat.to(dtype),
                       .gradients = {},
                       .flags = {},
                       .members = {}};
  const auto in_cast = [&](const at::Tensor& view) {
    return cast.flat.narrow(0, view.storage_offset() - bucket.flat.storage_offset(), view.numel()).view(view.sizes());
  };
  cast.gradients = in_cast(bucket.gradients);
  cast.flags = in_cast(bucket.flags);
  for (const auto& member : bucket.members) cast.members.push_back(in_cast(member));
  return cast;
}

struct legacy_random_state::engine : std::mt19937 {
  using std::mt19937::mt19937;
};

legacy_random_state::legacy_random_state(std::uint32_t seed) : engine_(std::make_unique<engine>(seed)) {}

legacy_random_state::~legacy_random_state() = default;

std::uint32_t legacy_random_state::randint(std::uint64_t high) {
  if (high == 0 || high > (std::uint64_t{1} << 32))
    throw std::invalid_argument("accel: legacy_random_state::randint takes a bound in [1, 2^32], not " +
                                std::to_string(high));
  const auto largest = static_cast<std::uint32_t>(high - 1);
  if (largest == 0) return 0;
  auto mask = largest;  // the smallest 2^k - 1 at or above it
  for (int shift = 1; shift < 32; shift *= 2) mask |= mask >> shift;
  std::uint32_t value = 0;
  do value = static_cast<std::uint32_t>((*engine_)()) & mask;
  while (value > largest);
  return value;
}

void orthogonalize_gram_schmidt(const at::Tensor& matrices, double epsilon) {
  const auto columns = matrices.size(2);
  const std::int64_t rows_dimension = 1;
  for (std::int64_t i = 0; i < columns; ++i) {
    auto column = matrices.narrow(2, i, 1);
    auto norm = at::linalg_vector_norm(column, 2, at::IntArrayRef(rows_dimension), /*keepdim=*/true);
    if (epsilon == 0)
      column.div_(norm.masked_fill_(norm == 0, 1));
    else
      column.div_(norm.add_(epsilon));
    if (i + 1 < columns) {
      auto rest = matrices.narrow(2, i + 1, columns - i - 1);
      rest.sub_(at::sum(column * rest, at::IntArrayRef(rows_dimension), /*keepdim=*/true) * column);
    }
  }
}

void orthogonalize(const at::Tensor& matrices, double epsilon) {
  const auto type = matrices.scalar_type();
  if (matrices.size(2) <= 2 || type == at::kHalf || type == at::kBFloat16)
    orthogonalize_gram_schmidt(matrices, epsilon);
  else
    matrices.copy_(std::get<0>(at::linalg_qr(matrices)));
}

bool worth_compressing(std::int64_t rows, std::int64_t columns, std::int64_t rank, double min_compression_rate) {
  return static_cast<double>((rows + columns) * rank) * min_compression_rate < static_cast<double>(rows * columns);
}

void fill_normal(const std::vector<at::Tensor>& qs, std::uint32_t seed) {
  auto generator = at::detail::createCPUGenerator(seed);
  for (const auto& q : qs) q.copy_(at::randn(q.sizes(), generator, at::TensorOptions().dtype(q.scalar_type())));
}

void check_comm_hook_options(const comm_hook_options& options, bool sums_bfloat16, bool computes_on_cpu) {
  if (!sums_bfloat16 && (options.hook == comm_hook::bf16 || options.wrapper == comm_wrapper::bf16))
    throw std::invalid_argument(
        "accel: options::comm_hook asks for bfloat16 all-reduces, which this LibTorch's Gloo cannot sum (LibTorch " +
        std::to_string(ACCEL_TORCH_VERSION / 100) + "." + std::to_string(ACCEL_TORCH_VERSION % 100) +
        "; 2.13's can): use comm_hook::fp16 or comm_wrapper::fp16, or LibTorch 2.x");
  if (options.hook != comm_hook::power_sgd && options.hook != comm_hook::batched_power_sgd) return;
  if (computes_on_cpu && !compat::cpu_multiplies_float16 && options.wrapper == comm_wrapper::fp16)
    throw std::invalid_argument(
        "accel: options::comm_hook wraps PowerSGD in comm_wrapper::fp16, whose float16 matrices PowerSGD multiplies "
        "on the CPU under Gloo, which this LibTorch cannot (LibTorch " +
        std::to_string(ACCEL_TORCH_VERSION / 100) + "." + std::to_string(ACCEL_TORCH_VERSION % 100) +
        ": \"addmm_impl_cpu_\" not implemented for 'Half', from the first compressed step on; 2.13's can): use "
        "PowerSGD without the wrapper (it compresses already), or LibTorch 2.x");
  const auto& settings = options.power_sgd;
  const std::string where = "accel: options::comm_hook.power_sgd.";
  if (settings.matrix_approximation_rank < 1)
    throw std::invalid_argument(where + "matrix_approximation_rank is " +
                                std::to_string(settings.matrix_approximation_rank) +
                                "; it is the rank of each gradient matrix's approximation and must be at least 1");
  if ((settings.use_error_feedback || settings.warm_start) && settings.start_power_sgd_iter <= 1)
    throw std::invalid_argument(where + "start_power_sgd_iter is " + std::to_string(settings.start_power_sgd_iter) +
                                "; with use_error_feedback or warm_start it must be > 1, because PowerSGD can only be "
                                "applied after the first two iterations (PyTorch's PowerSGDState refuses it too): "
                                "set it to 2 or more, or turn both off");
  if (settings.random_seed > 0xFFFF'FFFFu)
    throw std::invalid_argument(where + "random_seed is " + std::to_string(settings.random_seed) +
                                "; it seeds NumPy's RandomState, as in PyTorch, and must be below 2^32");
  if (!(settings.orthogonalization_epsilon >= 0) || !std::isfinite(settings.orthogonalization_epsilon))
    throw std::invalid_argument(where + "orthogonalization_epsilon is " +
                                std::to_string(settings.orthogonalization_epsilon) +
                                "; it is added to each column's norm and must be a finite value >= 0 (0: none)");
}

}  // namespace accel::detail
