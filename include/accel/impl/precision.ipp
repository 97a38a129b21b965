/// \file
/// What precision.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../precision.hpp"

namespace accel::detail {

autocast_scope::autocast_scope(c10::DeviceType device, c10::ScalarType dtype)
    : device_(device), was_enabled_(compat::autocast_enabled(device)), previous_dtype_(compat::autocast_dtype(device)) {
  compat::set_autocast_dtype(device, dtype);  // first: 1.13 refuses some dtypes, and must not be left enabled
  compat::set_autocast_enabled(device, true);
  at::autocast::increment_nesting();
}

autocast_scope::~autocast_scope() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_, was_enabled_);
  compat::set_autocast_dtype(device_, previous_dtype_);
}

void require_autocast(const c10::Device& device, c10::ScalarType dtype, const char* policy, const char* suggestion) {
  if (!compat::autocast_supports(device.type(), dtype))
    throw std::invalid_argument(std::string("accel::") + policy + ": this LibTorch (" + TORCH_VERSION + ") has no " +
                                c10::toString(dtype) + " autocast on " + device.str() + "; " + suggestion);
}

bool unscale_fused(std::vector<at::Tensor>& grads, float inverse) {
  const auto options = at::TensorOptions().dtype(at::kFloat).device(grads.front().device());
  auto found = at::zeros({1}, options);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found, at::full({1}, inverse, options));
  return found.item<float>() > 0;
}

bool unscale_each(std::vector<at::Tensor>& grads, float inverse) {
  auto found = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(grads.front().device()));
  for (auto& grad : grads) {
    found.add_(grad.isfinite().logical_not().any());
    grad.mul_(inverse);
  }
  return found.item<float>() > 0;
}

grad_scaler::grad_scaler(const grad_scaler_options& opts)
    : options_(opts), scale_(static_cast<float>(opts.init_scale)) {
  if (!(opts.init_scale > 0) || !(opts.growth_factor > 1) || !(opts.backoff_factor > 0 && opts.backoff_factor < 1) ||
      opts.growth_interval < 1)
    throw std::invalid_argument(
        "accel: grad_scaler_options need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
        "growth_interval >= 1");
}

at::Tensor grad_scaler::scale(const at::Tensor& loss) {
  if (step_taken_) {
    ++iteration_;
    step_taken_ = false;
    any_skipped_ = false;
  }
  backward_scale_ = scale_;
  const bool reduced = loss.scalar_type() == at::kHalf || loss.scalar_type() == at::kBFloat16;
  return (reduced ? loss.to(at::kFloat) : loss) * scale_;
}

bool grad_scaler::unscaled(const torch::optim::Optimizer& optimizer) const {
  auto found = per_optimizer_.find(&optimizer);
  return found != per_optimizer_.end() && found->second.iteration == iteration_ && found->second.unscaled;
}

void grad_scaler::load_state(const state_type& state) noexcept {
  scale_ = state.scale;
  growth_tracker_ = state.growth_tracker;
}

grad_scaler::optimizer_state& grad_scaler::current_state(const torch::optim::Optimizer& optimizer) {
  auto& state = per_optimizer_[&optimizer];
  if (state.iteration != iteration_) state = {.iteration = iteration_};
  return state;
}

void grad_scaler::update(bool found_inf) {
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    const auto grown = static_cast<float>(scale_ * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

bool grad_scaler::unscale_gradients(torch::optim::Optimizer& optimizer) const {
  const double inverse = 1.0 / static_cast<double>(backward_scale_);  // in double, as PyTorch, then float32
  std::map<std::pair<c10::DeviceType, c10::DeviceIndex>, std::vector<at::Tensor>> by_device;
  for (auto& group : optimizer.param_groups())
    for (auto& parameter : group.params())
      if (parameter.grad().defined())
        by_device[{parameter.device().type(), parameter.device().index()}].push_back(parameter.mutable_grad());
  bool found_inf = false;
  for (auto& [device, grads] : by_device) {
    const auto factor = static_cast<float>(inverse);
    const bool found =
        compat::fused_unscale_available(device.first) ? unscale_fused(grads, factor) : unscale_each(grads, factor);
    found_inf = found_inf || found;
  }
  return found_inf;
}
}  // namespace accel::detail

namespace accel {

bf16::bf16(const options&, const c10::Device& device) {
  detail::require_autocast(device, at::kBFloat16, "bf16", "use accel::fp32 on this device");
}

fp16::fp16(const options& opts, const c10::Device& device) : fp16(opts) {
  detail::require_autocast(device, at::kHalf, "fp16",
                           "use accel::bf16 on the CPU (bfloat16 needs no loss scaling), or run on a CUDA device");
}

void fp16::save_state(torch::serialize::OutputArchive& archive) const {
  archive.write("loss_scale", c10::IValue(static_cast<double>(scaler_.state().scale)));
  archive.write("growth_tracker", c10::IValue(static_cast<std::int64_t>(scaler_.state().growth_tracker)));
}

void fp16::load_state(torch::serialize::InputArchive& archive) {
  c10::IValue scale, tracker;
  if (!archive.try_read("loss_scale", scale) || !archive.try_read("growth_tracker", tracker))
    throw checkpoint_error("lacks the fp16 loss scale (saved by another configuration?)");
  scaler_.load_state({static_cast<float>(scale.toDouble()), static_cast<int>(tracker.toInt())});
}

}  // namespace accel
