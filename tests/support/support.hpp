// Shared fixtures for accel's tests: small models and data whose results are known exactly.
#pragma once

#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "accel_headers.hpp"
#include "scoped_variable.hpp"

namespace accel_test {

/// An empty directory of this test process's own under the temporary directory (emptied if it was there).
inline std::filesystem::path scratch_directory(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("accel_" + name + "_" + std::to_string(::getpid()));
  accel::detail::remove_tree(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// Copies the directory `from` with everything under it to `to` (std::filesystem::copy with copy_options::recursive
/// iterates with the directory iterators that lint.directory_iterators keeps out: accel/detail/support/
/// directory_entries.hpp says why).
inline void copy_tree(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::filesystem::create_directories(to);
  for (const auto& entry : accel::detail::directory_entries(from)) {
    if (entry.is_symlink())
      std::filesystem::copy_symlink(entry.path(), to / entry.path().filename());
    else if (entry.is_directory())
      copy_tree(entry.path(), to / entry.path().filename());
    else
      std::filesystem::copy_file(entry.path(), to / entry.path().filename());
  }
}

/// A directory path shared by the processes of one multi-process job, and by no other job: `stem` followed by the
/// job's MASTER_PORT, under the temporary directory (not created).
inline std::filesystem::path job_directory(const std::string& stem) {
  const char* port = std::getenv("MASTER_PORT");
  return std::filesystem::temp_directory_path() / (stem + (port != nullptr ? port : "0"));
}

/// Case J3: the sizes Accelerate's find_executable_batch_size(starting_batch_size=128) tries down to 8.
inline const std::vector<int> j3_sizes{128, 115, 103, 92, 82, 73, 65, 58, 52, 46, 41, 36,
                                       32,  28,  25,  22, 19, 17, 15, 13, 11, 9,  8};

/// Where `allocate_too_much` puts its allocation's address, so that it cannot be optimised away.
inline volatile void* escaped_allocation = nullptr;

/// A real failed allocation: 4 PiB, which LibTorch's CPU allocator refuses with a c10::Error.
inline void allocate_too_much() {
  auto tensor = torch::empty({1LL << 50});
  escaped_allocation = tensor.data_ptr();
}

/// The whole contents of `file` (empty when it cannot be read).
inline std::string text_of(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Two-layer perceptron, the workhorse of the equivalence tests.
struct mlp_impl : torch::nn::Module {
  mlp_impl(int in, int hidden, int out, double dropout = 0.0)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        drop(register_module("drop", torch::nn::Dropout(dropout))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, out))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(drop(torch::relu(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};
TORCH_MODULE_IMPL(mlp, mlp_impl);

/// A model whose forward takes two inputs.
struct bilinear_sum_impl : torch::nn::Module {
  bilinear_sum_impl()
      : a(register_module("a", torch::nn::Linear(3, 2))), b(register_module("b", torch::nn::Linear(4, 2))) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) { return a(x) + b(y); }
  torch::nn::Linear a;
  torch::nn::Linear b;
};
TORCH_MODULE_IMPL(bilinear_sum, bilinear_sum_impl);

using batch = std::pair<torch::Tensor, torch::Tensor>;

/// `count` regression batches of `size` rows (inputs `in` wide, targets `out` wide), deterministic for `seed`.
inline std::vector<batch> regression_batches(int count, int size, int in, int out, std::uint64_t seed = 7) {
  torch::manual_seed(seed);
  std::vector<batch> batches;
  for (int i = 0; i < count; ++i) batches.emplace_back(torch::randn({size, in}), torch::randn({size, out}));
  return batches;
}

/// True when every parameter of `a` equals the matching one of `b` bit for bit.
inline bool bitwise_equal(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.parameters();
  auto pb = b.parameters();
  if (pa.size() != pb.size()) return false;
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i], pb[i])) return false;
  return true;
}

/// Number of batches a range yields, counted by iterating it (std::ranges::distance would ask size()).
template <class Range>
std::size_t count_batches(Range&& range) {
  std::size_t n = 0;
  for (auto&& b : range) {
    (void)b;
    ++n;
  }
  return n;
}

/// The TensorImpl of each parameter: what optimizers key their state by.
inline std::vector<const void*> parameter_identities(torch::nn::Module& m) {
  std::vector<const void*> ids;
  for (const auto& p : m.parameters()) ids.push_back(p.unsafeGetTensorImpl());
  return ids;
}

/// AdamW's state, parameter by parameter in group order (exp_avg, exp_avg_sq and the step as a tensor; nothing for a
/// parameter that never stepped).
inline std::vector<torch::Tensor> adamw_state(torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> tensors;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) {
      const auto found = optimizer.state().find(accel::detail::compat::optimizer_state_key(p));
      if (found == optimizer.state().end()) continue;
      auto& state = static_cast<torch::optim::AdamWParamState&>(*found->second);
      tensors.insert(tensors.end(), {state.exp_avg(), state.exp_avg_sq(), torch::tensor(state.step())});
    }
  return tensors;
}
/// The same of an optimizer whose state is loaded from `file` (an `optimizer.bin` of a checkpoint).
inline std::vector<torch::Tensor> adamw_state(torch::optim::Optimizer& optimizer, const std::filesystem::path& file) {
  torch::serialize::InputArchive archive;
  archive.load_from(file.string());
  optimizer.load(archive);
  return adamw_state(optimizer);
}
/// True when two lists of tensors are equal bit for bit.
inline bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

/// Sets lr = base * f(n) after its n-th step, as PyTorch's LambdaLR (LibTorch has none).
class lambda_lr {
 public:
  lambda_lr(torch::optim::Optimizer& optimizer, std::function<double(int)> factor)
      : optimizer_(optimizer), factor_(std::move(factor)), base_(lr()) {}
  void step() {
    ++steps_;
    for (auto& group : optimizer_.param_groups()) group.options().set_lr(base_ * factor_(steps_));
  }
  [[nodiscard]] double lr() const { return optimizer_.param_groups()[0].options().get_lr(); }
  [[nodiscard]] int steps() const { return steps_; }
  // Checkpointing (accel's customisation point); the learning rate itself travels with the optimizer.
  void save(torch::serialize::OutputArchive& archive) const {
    archive.write("steps", c10::IValue(std::int64_t{steps_}));
  }
  void load(torch::serialize::InputArchive& archive) {
    c10::IValue steps;
    archive.read("steps", steps);
    steps_ = static_cast<int>(steps.toInt());
  }

 private:
  torch::optim::Optimizer& optimizer_;
  std::function<double(int)> factor_;
  double base_;
  int steps_ = 0;
};

/// accel::fp16 without its float16 autocast: the loss-scaling path, testable on any device and LibTorch.
struct scaled_fp32 : accel::fp16 {
  scaled_fp32(const accel::options& opts, const c10::Device&) : accel::fp16(opts) {}
  [[nodiscard]] static constexpr accel::detail::no_scope forward_scope(const c10::Device&) noexcept { return {}; }
};

/// Copies `from`'s parameters into `to`.
inline void copy_parameters(torch::nn::Module& to, torch::nn::Module& from) {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < to.parameters().size(); ++i) to.parameters()[i].copy_(from.parameters()[i]);
}

/// A training run for the resume tests: dropout (so the RNG matters), AdamW (so optimizer state matters), a
/// scheduler and a shuffled prepared data loader (so the data position matters). Built from `seed` (weights);
/// the data is the same in every run; dropout is seeded per process.
template <class Accelerator>
struct resumable_run {
  using samples_type = std::vector<std::pair<torch::Tensor, torch::Tensor>>;
  using loader_type = accel::data_loader<samples_type&>;
  static mlp seeded_mlp(std::uint64_t seed) {
    torch::manual_seed(seed);
    return mlp(3, 16, 1, /*dropout=*/0.3);
  }
  static samples_type make_samples(int count) {
    torch::manual_seed(42);
    samples_type samples;
    for (int i = 0; i < count; ++i) samples.emplace_back(torch::randn({3}), torch::randn({1}));
    return samples;
  }
  /// `checkpoints`: `accel::checkpoint_automatically`'s plan, made before the first pass (by default, none).
  resumable_run(std::uint64_t seed, int samples_count, const accel::options& options = {.cpu = true},
                const accel::automatic_checkpoint_options& checkpoints = {})
      : acc(options),
        net(seeded_mlp(seed)),
        optimizer(net->parameters(), torch::optim::AdamWOptions(1e-2)),
        schedule(optimizer, [](int n) { return 1.0 / (1 + 0.1 * n); }),
        samples(make_samples(samples_count)),
        loader(samples, {.batch_size = 4, .shuffle = true, .seed = 3}),
        model(acc.prepare(net)),
        opt(acc.prepare(optimizer)),
        sched(acc.prepare(schedule)),
        batches(acc.prepare(loader)) {
    accel::checkpoint_automatically(acc, checkpoints);
    torch::manual_seed(1000 + acc.process_index());
  }
  /// `steps` micro-steps, each inside `acc.accumulate(model)`.
  void train_accumulating(int steps) {
    int done = 0;
    while (done < steps)
      for (auto&& [x, y] : batches) {
        auto scope = acc.accumulate(model);
        acc.backward(torch::mse_loss(model(x), y));
        opt.step();
        sched.step();
        opt.zero_grad();
        if (++done == steps) return;
      }
  }
  void train(int steps) {
    int done = 0;
    while (done < steps)
      for (auto&& [x, y] : batches) {
        acc.backward(torch::mse_loss(model(x), y));
        opt.step();
        sched.step();
        opt.zero_grad();
        if (++done == steps) return;
      }
  }
  /// Trains until the accelerator has completed `total` optimizer steps, however many it had when it started (a
  /// run resumed from a checkpoint: its count). The epoch loop of a program that resumes by itself.
  void train_until(std::int64_t total) {
    while (acc.completed_steps() < total)
      for (auto&& [x, y] : batches) {
        acc.backward(torch::mse_loss(model(x), y));
        opt.step();
        sched.step();
        opt.zero_grad();
        if (acc.completed_steps() == total) return;
      }
  }
  Accelerator acc;
  mlp net;
  torch::optim::AdamW optimizer;
  lambda_lr schedule;
  samples_type samples;
  loader_type loader;
  accel::prepared_model<mlp, Accelerator> model;
  accel::prepared_optimizer<torch::optim::AdamW&, Accelerator> opt;
  accel::prepared_scheduler<lambda_lr&, Accelerator> sched;
  decltype(std::declval<Accelerator&>().prepare(std::declval<loader_type&>())) batches;
};

/// The run behind tests/data/checkpoint-v0.1 (a checkpoint written by accel before its policies saved their own
/// state, kept to show that later versions still load it): fp16's loss scaling (without autocast, so that any
/// LibTorch runs it), accumulation over 2 micro-steps, AdamW, a scheduler, a shuffled loader of 10 batches per epoch
/// and a registered object. `checkpoint_tool reference-state DIR` saved it after 14 micro-steps (mid-epoch, at
/// micro-step 4 of the epoch: a window's end, since gradients of an open window are not saved); `weights-after` holds
/// the weights of the same run done in one go, 9 micro-steps longer.
using reference_accelerator = accel::accelerator<scaled_fp32, accel::single_process, accel::accumulate<2>>;
inline constexpr int reference_steps_before_save = 14, reference_steps_after_save = 9;
struct reference_counter {
  std::int64_t value = 0;
  void save(torch::serialize::OutputArchive& out) const { out.write("value", c10::IValue(value)); }
  void load(torch::serialize::InputArchive& in) {
    c10::IValue v;
    in.read("value", v);
    value = v.toInt();
  }
};

/// Accelerate's test H3: a linear schedule from lr 10 to 0 over 20 optimizer steps, written for 2 processes, run
/// for 10 * N micro-steps of accumulation N (a backward, the optimizer's and the scheduler's step each); returns
/// the learning rate after each micro-step.
template <class Accelerator>
std::vector<double> linear_schedule_learning_rates(Accelerator& acc, int N) {
  auto net = torch::nn::Linear(1, 1);
  torch::optim::SGD optimizer(net->parameters(), 10.0);
  lambda_lr schedule(optimizer, [](int n) { return std::max(0.0, 1.0 - n / 20.0); });
  auto [model, opt, sched] = acc.prepare(net, optimizer, schedule);
  std::vector<double> lrs;
  for (int i = 0; i < 10 * N; ++i) {
    auto scope = acc.accumulate(model);
    acc.backward(model(torch::ones({1, 1})).sum());
    opt.step();
    sched.step();
    opt.zero_grad();
    lrs.push_back(schedule.lr());
  }
  return lrs;
}

/// A user's type with a serialiser (the members register_for_checkpointing takes), for the object collectives: a
/// sample's name, id and scores (any shape).
struct scored_sample {
  std::string name;
  std::int64_t id = 0;
  torch::Tensor scores;
  void save(torch::serialize::OutputArchive& out) const {
    out.write("name", c10::IValue(name));
    out.write("id", c10::IValue(id));
    out.write("scores", scores);
  }
  void load(torch::serialize::InputArchive& in) {
    c10::IValue read_name, read_id;
    in.read("name", read_name);
    in.read("id", read_id);
    in.read("scores", scores);
    name = read_name.toStringRef();
    id = read_id.toInt();
  }
  friend bool operator==(const scored_sample& a, const scored_sample& b) {
    return a.name == b.name && a.id == b.id && torch::equal(a.scores, b.scores);
  }
  friend std::ostream& operator<<(std::ostream& out, const scored_sample& s) {
    return out << "{" << s.name << ", " << s.id << ", " << s.scores.sizes() << "}";
  }
};

}  // namespace accel_test

/// Batches of scored samples go to the device as any batch (prepared ranges of them).
template <>
struct accel::batch_traits<accel_test::scored_sample> {
  static accel_test::scored_sample to_device(const accel_test::scored_sample& s, const torch::Device& device,
                                             bool non_blocking) {
    return {s.name, s.id, s.scores.to(device, non_blocking)};
  }
};
