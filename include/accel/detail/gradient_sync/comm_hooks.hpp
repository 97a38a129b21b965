/// \file
/// Gradient communication hooks (Accelerate's `DistributedDataParallelKwargs.comm_hook` / `comm_wrapper`, PyTorch's
/// DDP `register_comm_hook`): how the reducer of `data_parallel` (and zero1) reduces each bucket. Without a hook a
/// bucket is all-reduced as it is; a hook may compress it first (fp16, bf16) or send a low-rank approximation of
/// it (PowerSGD), as long as every process issues the same collectives in the same order.
///
/// The hooks reproduce PyTorch's (torch/distributed/algorithms/ddp_comm_hooks: default_hooks.py, powerSGD_hook.py)
/// with two differences of form: the bucket's gradients come divided by the world size already (PyTorch's hooks
/// divide after compressing), and each bucket ends with one "used" flag per member, which every hook sums exactly
/// (PowerSGD sends them with the members it does not compress, in the same all-reduce as the Ps: two collectives
/// per bucket where PyTorch issues three).
// IWYU pragma: private, include <accel/parallel.hpp>
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../collectives.hpp"
#include "../../options.hpp"
#include "../compat.hpp"

namespace accel::detail {

/// A bucket's reduction in flight: `wait()` completes it (waits for its collectives, runs what follows them), once.
class bucket_work {
 public:
  bucket_work() = default;
  /// A communicator's work, completed by its own `wait()` (kept behind a shared pointer: NCCL's is move-only).
  template <class Work>
    requires requires(Work& w) { w.wait(); }
  explicit bucket_work(Work work)
      : complete_([pending = std::make_shared<Work>(std::move(work))] { pending->wait(); }) {}
  /// Whatever `complete` does (wait for a chain of collectives and unpack their results, say).
  explicit bucket_work(std::function<void()> complete) : complete_(std::move(complete)) {}

  void wait() {
    if (complete_) std::exchange(complete_, {})();
  }

 private:
  std::function<void()> complete_;
};

/// What a hook sees of a bucket when it is complete: its flat tensor (each member's gradient, already divided by the
/// world size, then one "used on this process" flag per member, whose sum tells the reducer which parameters had a
/// gradient somewhere) and views into it.
struct bucket_contents {
  std::size_t index = 0;  // in launch order, the same on every process
  std::size_t count = 0;  // buckets of the model
  at::Tensor flat;
  at::Tensor gradients;             // flat's gradient part
  at::Tensor flags;                 // flat's flags
  std::vector<at::Tensor> members;  // each member's gradient in `gradients`, shaped as its parameter
};

/// A communication hook: reduces a complete bucket in place, so that once the returned work is waited for, `flat`
/// holds (an approximation of) the sum over the processes of their `flat`s, the flags exactly. Called for every
/// bucket of every synchronised backward, in bucket order, on every process.
template <communicator C>
class bucket_hook {
 public:
  bucket_hook() = default;
  bucket_hook(const bucket_hook&) = delete;
  bucket_hook& operator=(const bucket_hook&) = delete;
  virtual ~bucket_hook() = default;
  [[nodiscard]] virtual bucket_work launch(C& comm, const bucket_contents& bucket) = 0;
  /// Bytes handed to collectives since construction (what the hook saves is the point of it).
  [[nodiscard]] virtual std::uint64_t communicated_bytes() const noexcept { return communicated_bytes_; }

 protected:
  /// Starts the in-place sum of `tensor` over the processes, counting its bytes.
  auto all_reduce(C& comm, const at::Tensor& tensor) {
    communicated_bytes_ += static_cast<std::uint64_t>(tensor.nbytes());
    auto reduced = tensor;  // the same tensor: communicators take a mutable handle
    return comm.all_reduce(reduced, reduction::sum);
  }

 private:
  std::uint64_t communicated_bytes_ = 0;
};

/// `bucket` cast to `dtype` (itself when it has that type already): a flat tensor of its own and views into it.
ACCEL_DECL bucket_contents cast_bucket(const bucket_contents& bucket, at::ScalarType dtype);

/// PyTorch's `fp16_compress_hook` and `bf16_compress_hook` (without `inner`), and `fp16_compress_wrapper` and
/// `bf16_compress_wrapper` (around `inner`): the bucket is cast to `dtype`, all-reduced (or reduced by `inner`),
/// and cast back into place. Half the bytes of float32; flags of 0 and 1 sum exactly in either type.
template <communicator C>
class cast_hook final : public bucket_hook<C> {
 public:
  cast_hook(at::ScalarType dtype, std::unique_ptr<bucket_hook<C>> inner) : dtype_(dtype), inner_(std::move(inner)) {}

  [[nodiscard]] bucket_work launch(C& comm, const bucket_contents& bucket) override {
    auto cast = cast_bucket(bucket, dtype_);
    auto reduced = std::make_shared<bucket_work>(inner_ ? inner_->launch(comm, cast)
                                                        : bucket_work(this->all_reduce(comm, cast.flat)));
    return bucket_work([reduced, from = cast.flat, to = bucket.flat] {
      reduced->wait();
      to.copy_(from);
    });
  }
  [[nodiscard]] std::uint64_t communicated_bytes() const noexcept override {
    return inner_ ? inner_->communicated_bytes() : bucket_hook<C>::communicated_bytes();
  }

 private:
  at::ScalarType dtype_;
  std::unique_ptr<bucket_hook<C>> inner_;
};

/// NumPy's legacy `RandomState(seed)` as far as PowerSGD uses it (PyTorch's `PowerSGDState.rng`): MT19937 seeded by
/// `init_genrand`, which is what std::mt19937's seeding is, and `randint(high)`: a 32-bit draw masked to the bits of
/// `high - 1`, drawn again while above it. The same seed gives the same sequence as NumPy's, so the same Qs.
class legacy_random_state {
 public:
  ACCEL_DECL explicit legacy_random_state(std::uint32_t seed);
  ACCEL_DECL ~legacy_random_state();

  /// `randint(high)`: uniform in [0, high), for 1 <= high <= 2^32 (no draw for high = 1, as NumPy).
  ACCEL_DECL std::uint32_t randint(std::uint64_t high);

 private:
  struct engine;  // std::mt19937, defined in the compiled part so that this header needs no <random>
  std::unique_ptr<engine> engine_;
};

/// PyTorch's `_orthogonalize_gram_schmidt`: orthonormalises, in place, the columns of each matrix of the batch
/// `matrices` ([b, n, r]), dividing each column by its norm plus `epsilon`. A column of zeros stays zeros where
/// PyTorch's divides 0 by 0 into NaN (its code means to zero it: the `ZeroDivisionError` it catches never comes).
ACCEL_DECL void orthogonalize_gram_schmidt(const at::Tensor& matrices, double epsilon);

/// PyTorch's `_orthogonalize`: Gram-Schmidt for a rank of at most 2 or a 16-bit type (which QR does not take), QR
/// otherwise; in place, `matrices` being a batch [b, n, r] with r <= n.
ACCEL_DECL void orthogonalize(const at::Tensor& matrices, double epsilon);

/// PyTorch's `_should_compress`: whether sending a `rows` x `columns` matrix as P (rows x rank) and Q (columns x
/// rank) saves more than a factor `min_compression_rate` of its elements.
ACCEL_DECL bool worth_compressing(std::int64_t rows, std::int64_t columns, std::int64_t rank,
                                  double min_compression_rate);

/// PyTorch's random Qs: `torch.manual_seed(seed)`, then `torch.randn` of each Q in turn, in its type, on the CPU (a
/// generator of its own here, so the process's default one is left alone, as `fork_rng` does).
ACCEL_DECL void fill_normal(const std::vector<at::Tensor>& qs, std::uint32_t seed);

/// Throws `std::invalid_argument`, naming the fix, for settings PyTorch refuses or that cannot work on the backend,
/// as it declares itself: bfloat16 all-reduces where it cannot sum them (`sums_bfloat16` false), float16 matrices
/// PowerSGD multiplies on the CPU (`computes_on_cpu`) where LibTorch cannot. The PowerSGD settings are read only when
/// a PowerSGD hook is asked for, as Accelerate passes `comm_state_option` only then.
ACCEL_DECL void check_comm_hook_options(const comm_hook_options& options, bool sums_bfloat16, bool computes_on_cpu);

/// What PyTorch's two PowerSGD hooks share: the settings, the seeds of the Qs, the iteration count and the plain
/// all-reduce before `start_power_sgd_iter`, and each bucket's memory (error, last Q).
template <communicator C>
class power_sgd_base : public bucket_hook<C> {
 public:
  explicit power_sgd_base(const power_sgd_options& settings)
      : settings_(settings), seeds_(static_cast<std::uint32_t>(settings.random_seed)) {}

  [[nodiscard]] bucket_work launch(C& comm, const bucket_contents& bucket) final {
    if (iteration_ < settings_.start_power_sgd_iter) {
      bucket_work work(this->all_reduce(comm, bucket.flat));
      count_iteration(bucket);
      return work;
    }
    if (memory_.size() < bucket.count) memory_.resize(bucket.count);
    return compress(comm, bucket, memory_[bucket.index]);
  }

 protected:
  /// What PowerSGD keeps of a bucket from one step to the next.
  struct bucket_memory {
    at::Tensor error;  // what the last approximation missed of this process's gradients (error feedback)
    at::Tensor q;      // the last Qs, all-reduced (warm start); undefined: draw new ones
  };

  /// Reduces `bucket` from `start_power_sgd_iter` on; the returned work ends with `finish`.
  [[nodiscard]] virtual bucket_work compress(C& comm, const bucket_contents& bucket, bucket_memory& memory) = 0;

  /// Error feedback: adds the last step's error to `input` and returns a copy of the sum, what this step's error
  /// is measured from (undefined without error feedback).
  at::Tensor add_error(const at::Tensor& input, bucket_memory& memory) const {
    if (!settings_.use_error_feedback) return {};
    if (memory.error.defined())
      input.add_(memory.error);
    else
      memory.error = at::zeros_like(input);
    return input.clone();
  }

  /// Whether this step draws new Qs (no warm start, or none kept yet).
  [[nodiscard]] bool needs_new_qs(const bucket_memory& memory) const {
    return !settings_.warm_start || !memory.q.defined();
  }
  /// The seed of the next random Qs, drawn as PowerSGDState does (`rng.randint(1_000_000_000)`).
  std::uint32_t next_seed() { return seeds_.randint(1'000'000'000); }

  /// Completes a compressed step. The error is `before` (this process's gradients and last error, as they came:
  /// divided by the world size) less `result` (the average) divided by the world size: PyTorch's error (its input
  /// less the average) at the scale the gradients come in. The Qs are forgotten without warm start; the step is
  /// counted.
  void finish(const bucket_contents& bucket, bucket_memory& memory, at::Tensor before, const at::Tensor& result,
              int world_size) {
    if (settings_.use_error_feedback) memory.error = before.sub_(result, 1.0 / world_size);
    if (!settings_.warm_start) memory.q = at::Tensor();
    count_iteration(bucket);
  }

  [[nodiscard]] const power_sgd_options& settings() const noexcept { return settings_; }

 private:
  /// PyTorch's `maybe_increase_iter`: a step is counted at its last bucket.
  void count_iteration(const bucket_contents& bucket) {
    if (bucket.index + 1 == bucket.count) ++iteration_;
  }

  power_sgd_options settings_;
  legacy_random_state seeds_;
  std::int64_t iteration_ = 0;
  std::vector<bucket_memory> memory_;  // by bucket index
};

/// PyTorch's `powerSGD_hook`. Each member viewed as a matrix (its first dimension by the rest) whose rank-r
/// approximation saves more than `min_compression_rate` is sent as P = M Q, all-reduced and orthonormalised, then
/// Q = M^T P, all-reduced, and replaced by P Q^T; the other members, and the flags, are all-reduced as they are,
/// with the Ps. The Qs start random (seeded as PyTorch's) and, with warm start, go on from the last step's.
template <communicator C>
class power_sgd_hook final : public power_sgd_base<C> {
  using base = power_sgd_base<C>;
  using typename base::bucket_memory;

 public:
  using base::base;

 private:
  /// One step's split of a bucket: members sent whole, and the compressed ones as batches of matrices [b, n, m]
  /// (a view of one member, or a stack of several of the same shape, with those members to copy the result to).
  struct split {
    std::vector<at::Tensor> whole;
    std::vector<at::Tensor> batches;
    std::vector<std::vector<at::Tensor>> stacked;  // by batch: the members it stacks (empty: a view)
    std::int64_t gathered_elements = 0;
    std::int64_t p_elements = 0;
    std::int64_t q_elements = 0;
  };

  [[nodiscard]] split split_bucket(const bucket_contents& bucket) const {
    split parts;
    // The compressed matrices grouped by shape, in the order each shape first comes (PyTorch's shape_to_tensors).
    std::vector<std::pair<std::vector<std::int64_t>, std::vector<at::Tensor>>> by_shape;
    for (const auto& member : bucket.members) {
      const auto rows = member.dim() == 0 ? 0 : member.size(0);
      const auto columns = rows == 0 ? 0 : member.numel() / rows;
      if (rows == 0 || columns == 0 ||
          !worth_compressing(rows, columns, rank_for(rows, columns), this->settings().min_compression_rate)) {
        parts.whole.push_back(member);
        parts.gathered_elements += member.numel();
        continue;
      }
      const std::vector<std::int64_t> shape{rows, columns};
      auto group = std::find_if(by_shape.begin(), by_shape.end(), [&](const auto& g) { return g.first == shape; });
      if (group == by_shape.end()) group = by_shape.insert(by_shape.end(), {shape, {}});
      group->second.push_back(member.view({rows, columns}));
    }
    for (auto& [shape, matrices] : by_shape) {
      const auto rank = rank_for(shape[0], shape[1]);
      const auto count = static_cast<std::int64_t>(matrices.size());
      parts.p_elements += count * shape[0] * rank;
      parts.q_elements += count * shape[1] * rank;
      if (this->settings().batch_tensors_with_same_shape && count > 1) {
        parts.batches.push_back(at::stack(matrices));
        parts.stacked.push_back(std::move(matrices));
        continue;
      }
      for (auto& matrix : matrices) {
        parts.batches.push_back(matrix.unsqueeze(0));
        parts.stacked.emplace_back();
      }
    }
    return parts;
  }

  [[nodiscard]] std::int64_t rank_for(std::int64_t rows, std::int64_t columns) const {
    return std::min({rows, columns, static_cast<std::int64_t>(this->settings().matrix_approximation_rank)});
  }

  /// Views [b, n or m, rank] of `memory`, one per batch, consecutive from its start.
  [[nodiscard]] std::vector<at::Tensor> low_rank_views(const split& parts, const at::Tensor& memory,
                                                       std::int64_t dimension) const {
    std::vector<at::Tensor> views;
    std::int64_t offset = 0;
    for (const auto& batch : parts.batches) {
      const auto rank = rank_for(batch.size(1), batch.size(2));
      const auto elements = batch.size(0) * batch.size(dimension) * rank;
      views.push_back(memory.narrow(0, offset, elements).view({batch.size(0), batch.size(dimension), rank}));
      offset += elements;
    }
    return views;
  }

  [[nodiscard]] bucket_work compress(C& comm, const bucket_contents& bucket, bucket_memory& memory) override {
    auto before = this->add_error(bucket.gradients, memory);
    auto parts = split_bucket(bucket);
    // One all-reduce for the whole members, the flags and the Ps.
    const auto flags = bucket.flags.numel();
    auto sent = at::empty({parts.gathered_elements + flags + parts.p_elements}, bucket.flat.options());
    std::int64_t offset = 0;
    for (const auto& member : parts.whole) {
      sent.narrow(0, offset, member.numel()).copy_(member.reshape({-1}));
      offset += member.numel();
    }
    sent.narrow(0, offset, flags).copy_(bucket.flags);
    auto ps = low_rank_views(parts, sent.narrow(0, offset + flags, parts.p_elements), 1);
    const bool new_qs = this->needs_new_qs(memory);
    if (new_qs) memory.q = at::empty({parts.q_elements}, bucket.flat.options());
    auto qs = low_rank_views(parts, memory.q, 2);
    if (new_qs) fill_normal(qs, this->next_seed());  // a seed is drawn even for a bucket without matrices, as PyTorch
    const auto epsilon = this->settings().orthogonalization_epsilon;
    for (const auto& q : qs) orthogonalize(q, epsilon);
    for (std::size_t i = 0; i < parts.batches.size(); ++i) at::bmm_out(ps[i], parts.batches[i], qs[i]);
    auto first = std::make_shared<decltype(this->all_reduce(comm, sent))>(this->all_reduce(comm, sent));
    return bucket_work([this, &comm, &memory, bucket, parts = std::move(parts), sent, ps = std::move(ps),
                        qs = std::move(qs), before, first, epsilon]() mutable {
      first->wait();
      std::int64_t unpacked = 0;
      for (auto& member : parts.whole) {
        member.copy_(sent.narrow(0, unpacked, member.numel()).view(member.sizes()));
        unpacked += member.numel();
      }
      bucket.flags.copy_(sent.narrow(0, unpacked, bucket.flags.numel()));
      for (const auto& p : ps) orthogonalize(p, epsilon);
      for (std::size_t i = 0; i < parts.batches.size(); ++i)
        at::bmm_out(qs[i], parts.batches[i].transpose(1, 2), ps[i]);
      if (memory.q.numel() > 0) this->all_reduce(comm, memory.q).wait();
      for (std::size_t i = 0; i < parts.batches.size(); ++i) {
        at::bmm_out(parts.batches[i], ps[i], qs[i].transpose(1, 2));
        for (std::size_t k = 0; k < parts.stacked[i].size(); ++k)
          parts.stacked[i][k].copy_(parts.batches[i][static_cast<std::int64_t>(k)]);
      }
      this->finish(bucket, memory, before, bucket.gradients, comm.size());
    });
  }
};

/// PyTorch's `batched_powerSGD_hook`: the bucket's gradients, padded with zeros to a square, compressed as one
/// matrix (P and Q of its side by the rank), the flags sent with P. PyTorch 2.13's own hook fails on its first
/// compressed step (it orthogonalises 2-D Qs, which `_orthogonalize` refuses); here they are a batch of one, as
/// meant. The rank is at most the side (PyTorch's would fail there too).
template <communicator C>
class batched_power_sgd_hook final : public power_sgd_base<C> {
  using base = power_sgd_base<C>;
  using typename base::bucket_memory;

 public:
  using base::base;

 private:
  [[nodiscard]] bucket_work compress(C& comm, const bucket_contents& bucket, bucket_memory& memory) override {
    const auto length = bucket.gradients.numel();
    const auto side = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(length))));
    const auto rank = std::min(side, static_cast<std::int64_t>(this->settings().matrix_approximation_rank));
    auto square = at::zeros({side * side}, bucket.flat.options());
    square.narrow(0, 0, length).copy_(bucket.gradients);
    auto before = this->add_error(square, memory);
    auto matrix = square.view({side, side});
    if (this->needs_new_qs(memory)) {
      memory.q = at::empty({side, rank}, bucket.flat.options());
      fill_normal({memory.q}, this->next_seed());
    }
    orthogonalize(memory.q.unsqueeze(0), 0);  // PyTorch's batched hook passes no epsilon
    const auto flags = bucket.flags.numel();
    auto sent = at::empty({flags + side * rank}, bucket.flat.options());
    sent.narrow(0, 0, flags).copy_(bucket.flags);
    auto p = sent.narrow(0, flags, side * rank).view({side, rank});
    at::mm_out(p, matrix, memory.q);
    auto first = std::make_shared<decltype(this->all_reduce(comm, sent))>(this->all_reduce(comm, sent));
    return bucket_work([this, &comm, &memory, bucket, sent, p, matrix, square, before, first, length]() mutable {
      first->wait();
      bucket.flags.copy_(sent.narrow(0, 0, bucket.flags.numel()));
      orthogonalize(p.unsqueeze(0), 0);
      at::mm_out(memory.q, matrix.t(), p);
      this->all_reduce(comm, memory.q).wait();
      at::mm_out(matrix, p, memory.q.t());
      bucket.gradients.copy_(square.narrow(0, 0, length));
      this->finish(bucket, memory, before, square, comm.size());
    });
  }
};

/// The hook `options` asks for, or none (the bucket is all-reduced as it is). The options are checked by the
/// parallel policy (check_comm_hook_options), which knows its backend.
template <communicator C>
std::unique_ptr<bucket_hook<C>> make_bucket_hook(const comm_hook_options& options) {
  std::unique_ptr<bucket_hook<C>> hook;
  switch (options.hook) {
    case comm_hook::none:
      break;
    case comm_hook::fp16:
      hook = std::make_unique<cast_hook<C>>(at::kHalf, nullptr);
      break;
    case comm_hook::bf16:
      hook = std::make_unique<cast_hook<C>>(at::kBFloat16, nullptr);
      break;
    case comm_hook::power_sgd:
      hook = std::make_unique<power_sgd_hook<C>>(options.power_sgd);
      break;
    case comm_hook::batched_power_sgd:
      hook = std::make_unique<batched_power_sgd_hook<C>>(options.power_sgd);
      break;
  }
  if (options.wrapper == comm_wrapper::none) return hook;
  return std::make_unique<cast_hook<C>>(options.wrapper == comm_wrapper::fp16 ? at::kHalf : at::kBFloat16,
                                        std::move(hook));
}

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/comm_hooks.ipp"
#endif
