// A test-only precision policy with checkpointed state of its own, added without touching the accelerator: fp32
// that counts the parameters it saw at prepare, and the backward passes and the largest loss since training began
// (what a policy that adapts to the loss, such as a loss scaler, keeps across a restart).
#pragma once

#include "accel_headers.hpp"

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace accel_test {

struct watching_precision : accel::fp32 {
  using fp32::fp32;
  [[nodiscard]] static constexpr std::string_view name() noexcept { return "watching_precision"; }
  [[nodiscard]] static constexpr std::string_view mixed_precision() noexcept { return ""; }

  void prepare_model(torch::nn::Module& module) {
    parameters_prepared += static_cast<std::int64_t>(module.parameters().size());
  }
  void backward(const at::Tensor& loss) {
    ++backwards;
    largest_loss = std::max(largest_loss, loss.item<double>());
    loss.backward();
  }

  void save_state(torch::serialize::OutputArchive& archive) const {
    archive.write("watching_backwards", c10::IValue(backwards));
    archive.write("watching_largest_loss", c10::IValue(largest_loss));
  }
  void load_state(torch::serialize::InputArchive& archive) {
    c10::IValue count, largest;
    if (!archive.try_read("watching_backwards", count) || !archive.try_read("watching_largest_loss", largest))
      throw accel::checkpoint_error("lacks watching_precision's state");
    backwards = count.toInt();
    largest_loss = largest.toDouble();
  }

  std::int64_t parameters_prepared = 0, backwards = 0;
  double largest_loss = 0;
};

}  // namespace accel_test
