/// \file
/// `accel::accelerator<Precision, Parallel, Accumulation>`: composes three policies into a training loop's
/// backward, gradient sync and optimizer step. Each policy decides its own part, so the code generated for a
/// configuration holds no run-time branch on a decision a template argument already made.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <iostream>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <utility>

#include "accumulation.hpp"
#include "concepts.hpp"
#include "detail/diagnostics.hpp"
#include "options.hpp"
#include "parallel.hpp"
#include "precision.hpp"
#include "prepared_model.hpp"
#include "prepared_optimizer.hpp"
#include "prepared_range.hpp"
#include "prepared_scheduler.hpp"

namespace accel {
namespace detail {
template <class T>
inline constexpr bool is_prepared_model = false;
template <class M, class A>
inline constexpr bool is_prepared_model<prepared_model<M, A>> = true;
}  // namespace detail

/// The training-loop driver. Default-constructible; `accelerator(options)` sets the run-time knobs.
///
/// Prepared objects refer to the accelerator that prepared them, so an accelerator is neither copied nor moved:
/// build it first and keep it alive for as long as they are used (as Accelerate's process-wide state is).
template <precision_policy Precision = fp32, parallel_policy Parallel = single_process,
          accumulation_policy Accumulation = no_accumulation>
class accelerator {
 public:
  using precision_type = Precision;
  using parallel_type = Parallel;
  using accumulation_type = Accumulation;

  accelerator() : accelerator(options{}) {}
  explicit accelerator(const options& opts)
      : parallel_(opts), precision_(opts), accumulation_(opts), device_placement_(opts.device_placement) {}

  accelerator(const accelerator&) = delete;
  accelerator& operator=(const accelerator&) = delete;

  /// Prepares models, optimizers, LR schedulers and ranges of batches for this configuration and returns them
  /// in the same order (a tuple; one argument gives the prepared object itself). Lvalues are referred to,
  /// rvalues are owned. Models are moved to `device()` in place, so optimizers built on their parameters keep
  /// pointing at them.
  template <class... Objects>
  [[nodiscard]] auto prepare(Objects&&... objects) {
    static_assert(sizeof...(Objects) > 0, "accel::accelerator::prepare() needs at least one object to prepare");
    if constexpr (sizeof...(Objects) == 1)
      return prepare_one(std::forward<Objects>(objects)...);
    else
      return std::tuple{prepare_one(std::forward<Objects>(objects))...};  // braces: evaluated left to right
  }

  /// Runs backward on `loss`, divided by the accumulation steps and scaled as the precision policy requires.
  void backward(const at::Tensor& loss) { precision_.backward(accumulation_.scale_loss(loss)); }

  /// The precision policy's forward scope (autocast for bf16/fp16; nothing for fp32), for code outside a
  /// prepared model. Keep the returned object alive for as long as the scope should last.
  [[nodiscard]] auto autocast() const { return precision_.forward_scope(device()); }

  /// True on micro-steps where gradients are synchronised and the optimizer steps.
  [[nodiscard]] bool sync_gradients() const noexcept { return accumulation_.sync_gradients(); }
  /// True when the last optimizer step was skipped (fp16 found non-finite gradients).
  [[nodiscard]] bool optimizer_step_was_skipped() const noexcept { return precision_.step_was_skipped(); }

  [[nodiscard]] const c10::Device& device() const noexcept { return parallel_.device(); }
  [[nodiscard]] int process_index() const noexcept { return parallel_.process_index(); }
  [[nodiscard]] int local_process_index() const noexcept { return parallel_.local_process_index(); }
  [[nodiscard]] int num_processes() const noexcept { return parallel_.num_processes(); }
  [[nodiscard]] bool is_main_process() const noexcept { return process_index() == 0; }
  [[nodiscard]] bool is_local_main_process() const noexcept { return local_process_index() == 0; }
  [[nodiscard]] bool is_last_process() const noexcept { return process_index() == num_processes() - 1; }
  /// The policies themselves, read-only: their state (an fp16 loss scale, a process group) for tools built on
  /// accel.
  [[nodiscard]] const Precision& precision() const noexcept { return precision_; }
  [[nodiscard]] const Parallel& parallel() const noexcept { return parallel_; }
  [[nodiscard]] const Accumulation& accumulation() const noexcept { return accumulation_; }

  /// Whether `prepare()` places models and batches on `device()` (`options::device_placement`).
  [[nodiscard]] bool device_placement() const noexcept { return device_placement_; }

  /// Prints its arguments separated by spaces, then a newline, on the local main process only (as Python's
  /// `print` does in Accelerate's `accelerator.print`). The line is written in one piece.
  template <class... Args>
  void print(const Args&... args) const {
    if (!is_local_main_process()) return;
    std::ostringstream line;
    const char* separator = "";
    ((line << separator << args, separator = " "), ...);
    line << '\n';
    std::cout << line.str() << std::flush;
  }

  /// Blocks until every process reaches this point.
  void wait_for_everyone() { parallel_.wait_for_everyone(); }

  /// The model as the user built it: the handle (ModuleHolder or shared_ptr) of a prepared model; any other
  /// model handle is returned as it is. A handle shares the module, so this never copies parameters.
  template <class Model>
  [[nodiscard]] auto unwrap_model(const Model& model) const noexcept {
    if constexpr (detail::is_prepared_model<Model>)
      return model.unwrap();
    else
      return model;
  }

 private:
  template <class Optimizer, class Accelerator>
    requires optimizer_like<Optimizer>
  friend class prepared_optimizer;

  /// Called by `prepared_optimizer::step()`: steps only when gradients are synchronised; the precision policy
  /// decides how (and whether) to step.
  void step_optimizer(torch::optim::Optimizer& optimizer) {
    if (sync_gradients()) precision_.step(optimizer);
  }

  template <class Object>
  auto prepare_one(Object&& object) {
    using type = std::remove_cvref_t<Object>;
    static_assert(!detail::is_prepared<type>,
                  "accel::accelerator::prepare(): this object is already prepared; use the prepared object as it is");
    if constexpr (model_like<type>) {
      return prepare_model(type(std::forward<Object>(object)));
    } else if constexpr (optimizer_like<Object>) {
      return prepared_optimizer<Object, accelerator>(std::forward<Object>(object), *this);
    } else if constexpr (scheduler_like<Object>) {
      return prepared_scheduler<Object, accelerator>(std::forward<Object>(object), *this);
    } else if constexpr (batch_range<Object>) {
      return prepared_range<Object, accelerator>(std::forward<Object>(object), *this);
    } else {
      static_assert(detail::always_false<type>,
                    "accel::accelerator::prepare() takes models (torch::nn::ModuleHolder or "
                    "std::shared_ptr<torch::nn::Module>), optimizers (torch::optim::Optimizer), LR schedulers "
                    "(anything with step()) and ranges of batches (anything with begin()/end()); this argument is "
                    "none of them");
    }
  }

  template <class Model>
  prepared_model<Model, accelerator> prepare_model(Model model) {
    if (device_placement_) model->to(device());  // in place: the parameters keep their identity
    parallel_.prepare_model(*model);
    return {std::move(model), *this};
  }

  [[no_unique_address]] Parallel parallel_;
  [[no_unique_address]] Precision precision_;
  [[no_unique_address]] Accumulation accumulation_;
  bool device_placement_;
};

}  // namespace accel
