// A test-only parallel policy written against the facets (accel/concepts.hpp), in one file, as a user would write
// one: data parallelism that averages the gradients when the optimizer steps (one flat all-reduce per dtype), not
// during backward as data_parallel does. It joins uneven inputs by a protocol of its own (each averaging begins with
// a round that says who still trains), and keeps state of its own (the optimizer steps it took), which checkpoints
// save and load and join_uneven_inputs shares from the last process to finish.
#pragma once

#include "accel_headers.hpp"
#include <torch/csrc/utils/tensor_flatten.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string_view>
#include <vector>

namespace accel_test {

class step_synchronised : public accel::parallel_defaults, public accel::process_group_topology<accel::gloo> {
 public:
  using policy_category = accel::parallel_tag;
  [[nodiscard]] static constexpr std::string_view name() noexcept { return "step_synchronised"; }
  static constexpr bool joins_uneven_inputs = true;

  explicit step_synchronised(const accel::options& options) : process_group_topology(options) {}

  // Model preparation: every process starts from process 0's parameters and buffers.
  void prepare_model(torch::nn::Module& module) {
    broadcast_state(module, 0);
    models_.push_back(&module);
  }
  static constexpr void before_forward(const torch::nn::Module&) noexcept {}
  void release_models() {
    models_.clear();
    optimizers_.clear();
  }

  // Gradient synchronisation: backward never communicates, so there is nothing to turn off.
  [[nodiscard]] static constexpr bool gradient_sync(const torch::nn::Module&) noexcept { return true; }
  static constexpr void set_gradient_sync(const torch::nn::Module&, bool, bool = false) noexcept {}

  // Optimizer stepping: the gradients are averaged once per step, before anything reads them.
  void prepare_optimizer(torch::optim::Optimizer& optimizer) { optimizers_.push_back(&optimizer); }
  void attach_gradients(torch::optim::Optimizer& optimizer) {
    if (!averaged_.insert(&optimizer).second) return;  // unscale, clip and step each ask
    if (joining_) announce(index_of(optimizer) + 1);
    average(optimizer, /*shadow=*/false);
  }
  void step_optimizer(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    averaged_.erase(&optimizer);
    ++steps;
  }
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
    parallel_defaults::zero_grad(optimizer, set_to_none);
    averaged_.erase(&optimizer);  // a step the precision policy skipped leaves its average behind
  }

  // Uneven inputs: a process that ran out of data answers each round with 0 and adds zeros to the average of the
  // optimizer the others step, until every process is done; then every process takes the last one's model.
  void begin_join(const std::vector<const torch::nn::Module*>&) { joining_ = true; }
  int finish_join() {
    joining_ = false;
    for (auto stepping = announce(0); stepping > 0; stepping = announce(0))
      average(*optimizers_.at(static_cast<std::size_t>(stepping - 1)), /*shadow=*/true);
    // The last to finish took the most steps (the highest process among equals).
    auto rank = at::full({1}, steps * num_processes() + process_index(), at::kLong);
    communicator().all_reduce(rank, accel::reduction::max).wait();
    const int last = static_cast<int>(rank.item<std::int64_t>() % num_processes());
    for (auto* module : models_) broadcast_state(*module, last);
    ++joins;
    return last;
  }
  static constexpr void abandon_join() noexcept {}

  // State of its own: saved in every process's file, loaded all or none, shared after a join.
  void save_state(torch::serialize::OutputArchive& archive) const {
    archive.write("step_synchronised_steps", c10::IValue(steps));
    archive.write("step_synchronised_joins", c10::IValue(joins));
  }
  void load_state(torch::serialize::InputArchive& archive) {
    c10::IValue saved_steps, saved_joins;
    if (!archive.try_read("step_synchronised_steps", saved_steps) ||
        !archive.try_read("step_synchronised_joins", saved_joins))
      throw accel::checkpoint_error("lacks step_synchronised's counts");
    steps = saved_steps.toInt();
    joins = saved_joins.toInt();
  }

  std::int64_t steps = 0;       // optimizer steps this process took
  std::int64_t joins = 0;       // joins it finished
  std::int64_t averagings = 0;  // gradient averagings it took part in, its own or shadowed (not saved)

 private:
  /// Every process's `value`, reduced to the largest.
  std::int64_t announce(std::int64_t value) {
    auto flag = at::full({1}, value, at::kLong);
    communicator().all_reduce(flag, accel::reduction::max).wait();
    return flag.item<std::int64_t>();
  }
  std::int64_t index_of(const torch::optim::Optimizer& optimizer) const {
    return std::find(optimizers_.begin(), optimizers_.end(), &optimizer) - optimizers_.begin();
  }
  /// The mean over every process of the gradients of `optimizer`'s parameters (zeros where one has none), one
  /// all-reduce per dtype; a `shadow` adds zeros and keeps nothing.
  void average(torch::optim::Optimizer& optimizer, bool shadow) {
    torch::NoGradGuard no_grad;
    std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
    for (auto& group : optimizer.param_groups())
      for (auto& p : group.params()) {
        if (!p.requires_grad()) continue;
        if (!p.grad().defined() || shadow) p.mutable_grad() = at::zeros_like(p);
        by_dtype[p.scalar_type()].push_back(p.grad());
      }
    for (auto& [dtype, grads] : by_dtype) {
      auto flat = torch::utils::flatten_dense_tensors(grads);
      communicator().all_reduce(flat, accel::reduction::sum).wait();
      flat.div_(num_processes());
      if (shadow) continue;
      const auto parts = torch::utils::unflatten_dense_tensors(flat, grads);
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i].copy_(parts[i]);
    }
    if (shadow)
      for (auto& group : optimizer.param_groups())
        for (auto& p : group.params()) p.mutable_grad() = at::Tensor();
    ++averagings;
  }
  void broadcast_state(torch::nn::Module& module, int source) {
    torch::NoGradGuard no_grad;
    for (auto tensor : module.parameters()) communicator().broadcast(tensor, source);
    for (auto tensor : module.buffers()) communicator().broadcast(tensor, source);
  }

  std::vector<torch::nn::Module*> models_;
  std::vector<torch::optim::Optimizer*> optimizers_;
  std::set<const torch::optim::Optimizer*> averaged_;
  bool joining_ = false;
};

}  // namespace accel_test
