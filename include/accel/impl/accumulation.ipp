/// \file
/// What accumulation.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../accumulation.hpp"

namespace accel::detail {

void micro_step_counter::begin_micro_step(int steps, bool end_of_dataloader) noexcept {
  if (end_of_dataloader) {
    step_ = 0;  // the window closes with the pass, and the next pass starts a new one
    sync_ = true;
  } else {
    ++step_;
    sync_ = step_ % steps == 0;
  }
}

void micro_step_counter::save_state(torch::serialize::OutputArchive& archive) const {
  archive.write("step", c10::IValue(step_));
  archive.write("sync_gradients", c10::IValue(sync_));
}

void micro_step_counter::load_state(torch::serialize::InputArchive& archive) {
  c10::IValue step, sync;
  if (!archive.try_read("step", step) || !archive.try_read("sync_gradients", sync)) return;
  step_ = step.toInt();
  sync_ = sync.toBool();
}

std::optional<int> accumulation_steps_in_environment() {
  const char* text = std::getenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const long steps = std::strtol(text, &end, 10);
  if (*end != '\0' || steps < 1 || steps > 1'000'000)
    throw std::invalid_argument(std::string("accel: ACCELERATE_GRADIENT_ACCUMULATION_STEPS=\"") + text +
                                "\" is not a whole number of micro-batches per step (at least 1)");
  return static_cast<int>(steps);
}

int accumulation_steps_from(const options& opts) {
  if (auto steps = accumulation_steps_in_environment()) return *steps;
  const int steps = opts.gradient_accumulation_steps.value_or(1);
  if (steps < 1)
    throw std::invalid_argument("accel: options::gradient_accumulation_steps = " + std::to_string(steps) +
                                " must be at least 1 (micro-batches per optimizer step)");
  return steps;
}

void check_new_steps(int steps, int current, const micro_step_counter& counter) {
  if (steps < 1 || steps > 1'000'000)
    throw std::invalid_argument("accel::accelerator::set_gradient_accumulation_steps(" + std::to_string(steps) +
                                "): N counts micro-batches per optimizer step and must be at least 1");
  if (!counter.sync_gradients())
    throw std::logic_error(
        "accel::accelerator::set_gradient_accumulation_steps(" + std::to_string(steps) +
        "): called in the middle of an accumulation window (micro-step " + std::to_string(counter.step()) +
        ", N = " + std::to_string(current) +
        "), whose gradients are accumulating, each divided by the old N; set it once the window has stepped (where "
        "acc.sync_gradients() is true), at the end of a pass, or after acc.free_memory()");
}

void check_fixed_steps(const options& opts, int steps) {
  if (auto from_environment = accumulation_steps_in_environment(); from_environment && *from_environment != steps)
    throw std::invalid_argument(
        "accel: ACCELERATE_GRADIENT_ACCUMULATION_STEPS=" + std::to_string(*from_environment) +
        " contradicts accel::accumulate<" + std::to_string(steps) +
        ">, which is fixed at compile time; unset the variable, or use accel::accumulate_dynamic "
        "to follow it");
  if (opts.gradient_accumulation_steps && *opts.gradient_accumulation_steps != steps)
    throw std::invalid_argument(
        "accel: options::gradient_accumulation_steps = " + std::to_string(*opts.gradient_accumulation_steps) +
        " contradicts accel::accumulate<" + std::to_string(steps) +
        ">; drop the option, or use accel::accumulate_dynamic to choose N at run time");
}
}  // namespace accel::detail

namespace accel {

void accumulate_dynamic::set_steps(int steps) {
  detail::check_new_steps(steps, steps_, counter_);
  steps_ = steps;
  counter_.start_new_window();
}

}  // namespace accel
