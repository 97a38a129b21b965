// A test-only parallel policy, added without touching the accelerator: data_parallel<gloo> that counts what the
// accelerator asks of it (optimizers prepared and stepped, overflow agreements, gradient-norm reductions) and
// checkpoints its counts through the policy state hooks.
#pragma once

#include "accel_headers.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

namespace accel_test {

struct counting_parallel : accel::data_parallel<accel::gloo> {
  using data_parallel::data_parallel;
  [[nodiscard]] static constexpr std::string_view name() noexcept { return "counting_parallel"; }

  void prepare_optimizer(torch::optim::Optimizer& optimizer) {
    ++optimizers_prepared;
    data_parallel::prepare_optimizer(optimizer);
  }
  void step_optimizer(torch::optim::Optimizer& optimizer) {
    ++optimizer_steps;
    data_parallel::step_optimizer(optimizer);
  }
  [[nodiscard]] bool any_non_finite(bool found_here) {
    ++non_finite_agreements;
    return data_parallel::any_non_finite(found_here);
  }
  [[nodiscard]] double gradient_norm(const std::vector<at::Tensor>& parameters, double norm_type) {
    ++norm_reductions;
    return data_parallel::gradient_norm(parameters, norm_type);
  }
  double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
    ++norm_reductions;
    return data_parallel::clip_grad_norm(parameters, max_norm, norm_type);
  }

  void save_state(torch::serialize::OutputArchive& archive) const {
    archive.write("counting_parallel_steps", c10::IValue(optimizer_steps));
    archive.write("counting_parallel_norms", c10::IValue(norm_reductions));
  }
  void load_state(torch::serialize::InputArchive& archive) {
    c10::IValue steps, norms;
    if (!archive.try_read("counting_parallel_steps", steps) || !archive.try_read("counting_parallel_norms", norms))
      throw accel::checkpoint_error("lacks counting_parallel's counts");
    optimizer_steps = steps.toInt();
    norm_reductions = norms.toInt();
  }

  std::int64_t optimizers_prepared = 0, optimizer_steps = 0, non_finite_agreements = 0, norm_reductions = 0;
};

}  // namespace accel_test
