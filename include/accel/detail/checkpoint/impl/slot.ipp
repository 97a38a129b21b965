/// \file
/// What slot.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../slot.hpp"

namespace accel::detail {

const std::set<std::string>& python_step_lr_keys() {
  static const std::set<std::string> keys{"step_size",  "gamma",       "base_lrs",
                                          "last_epoch", "_step_count", "verbose",
                                          "_last_lr",   "_is_initial", "_get_lr_called_within_step"};
  return keys;
}

void load_python_step_lr(torch::optim::StepLR& scheduler, const c10::IValue& saved, const std::string& file) {
  if (!saved.isGenericDict()) throw checkpoint_error(file + " is not a scheduler's state_dict");
  for (const auto& item : saved.toGenericDict())
    if (!item.key().isString() || !python_step_lr_keys().contains(item.key().toStringRef()))
      throw checkpoint_error(file + " holds \"" + (item.key().isString() ? item.key().toStringRef() : "?") +
                             "\", which PyTorch's StepLR has not: accel maps only StepLR's state onto LibTorch's "
                             "StepLR (use torch.optim.lr_scheduler.StepLR in Python)");
  const auto count = saved.toGenericDict().find(c10::IValue("_step_count"));
  if (count == saved.toGenericDict().end() || !count->value().isInt() || count->value().toInt() < 0)
    throw checkpoint_error(file + " lacks StepLR's _step_count");
  lr_scheduler_access::step_count(scheduler) = static_cast<unsigned>(count->value().toInt());
}

c10::IValue python_step_lr_state(const torch::optim::StepLR& scheduler) {
  const auto count = static_cast<std::int64_t>(
      lr_scheduler_access::step_count(static_cast<const torch::optim::LRScheduler&>(scheduler)));
  c10::impl::GenericDict state(c10::AnyType::get(), c10::AnyType::get());
  auto last_lrs = c10::impl::GenericList(c10::AnyType::get());
  for (const double lr : lr_scheduler_access::current_lrs(scheduler)) last_lrs.push_back(lr);
  state.insert("last_epoch", count - 1);
  state.insert("_step_count", count);
  state.insert("_last_lr", last_lrs);
  state.insert("_is_initial", false);
  state.insert("_get_lr_called_within_step", false);
  return c10::IValue(state);
}

}  // namespace accel::detail
