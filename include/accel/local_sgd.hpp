/// \file
/// `accel::local_sgd`: Accelerate's `LocalSGD`. While the scope lives, each process trains its own copy of a
/// data-parallel model (backward does not synchronise its gradients, as under `acc.no_sync(model)`), and every
/// `local_sgd_steps` steps the copies are averaged over the processes; the end of the scope averages them once more.
///
///     accel::local_sgd local(acc, model, 8);
///     for (auto&& [x, y] : batches) {
///       acc.backward(loss_fn(model(x), y));
///       optimizer.step();
///       optimizer.zero_grad();
///       local.step();
///     }
///     local.finish();  // the last averaging, here so that its errors can be thrown
///
/// Averaging is a barrier, then a mean all-reduce of the parameters (the sum over the processes divided by their
/// number, as Accelerate's `reduce(..., "mean")`), one per dtype and device with the parameters flattened together:
/// a collective, so every process steps as many times. Accelerate averages under `autocast`, which changes nothing
/// there: autocast picks the dtype of operators such as matrix products, not of an all-reduce or a division, and
/// parameters keep theirs (float32 under bf16 and fp16 too), so accel averages without it.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <exception>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "accelerator.hpp"
#include "collectives.hpp"
#include "parallel.hpp"

namespace accel {
namespace detail {
/// Replaces each of `parameters` by its mean over the processes: one mean all-reduce per dtype and device, of the
/// group flattened together.
template <class Accelerator>
void average_parameters(Accelerator& acc, const std::vector<at::Tensor>& parameters) {
  through_flat_groups(parameters, [&acc](at::Tensor& flat) { flat = acc.reduce(flat, reduction::mean); });
}
}  // namespace detail

/// Local SGD over a prepared model (Accelerate's `LocalSGD`): `accel::local_sgd local(acc, model, steps);`. With
/// `enabled` false, or with one process, it only counts steps. For `data_parallel` (and `single_process`): the
/// sharded policies keep slices of the model's state on each process, which averaging full parameters cannot
/// serve, and are refused at compile time.
///
/// The scope ends with `finish()` or, failing that, with its destructor, which cannot throw: should the final
/// averaging fail there (a collective that timed out, a process gone), it prints the error on std::cerr and ends the
/// process with std::terminate, since the job cannot go on with processes whose models differ. Call `finish()` to
/// have the error thrown instead. When the scope is left by an exception, the destructor does not average (the other
/// processes may never join the collective): it only gives the model its gradient synchronisation back.
template <class Accelerator, class Model>
class local_sgd {
  static_assert(Accelerator::parallel_type::steps_alone,
                "accel::local_sgd averages whole parameters, each process stepping its whole model alone between "
                "averagings: its parallel policy must declare steps_alone (data_parallel does; the sharded policies "
                "keep slices of the optimizer state and cannot)");
  using no_sync_scope = decltype(std::declval<Accelerator&>().no_sync(std::declval<const Model&>()));

 public:
  /// Starts the local window: with `enabled` and several processes, backward through `model` stops synchronising
  /// gradients until the scope ends. `local_sgd_steps` (at least 1) is how many steps each process takes alone
  /// between two averagings.
  local_sgd(Accelerator& acc, const Model& model, std::int64_t local_sgd_steps, bool enabled = true)
      : acc_(&acc),
        module_(&detail::module_of(model)),
        local_sgd_steps_(local_sgd_steps),
        enabled_(enabled && acc.num_processes() > 1) {
    if (local_sgd_steps < 1)
      throw std::invalid_argument("accel::local_sgd: local_sgd_steps is " + std::to_string(local_sgd_steps) +
                                  "; it is the number of steps between two averagings and must be at least 1");
    // A scope is neither copied nor moved: `new` builds it in place from the prvalue no_sync returns.
    if (enabled_) no_sync_.reset(new no_sync_scope(acc.no_sync(model)));
  }
  local_sgd(const local_sgd&) = delete;
  local_sgd& operator=(const local_sgd&) = delete;

  /// Averages once more and restores gradient synchronisation, unless `finish()` did or an exception is leaving the
  /// scope (see the class comment).
  ~local_sgd() {
    if (finished_ || std::uncaught_exceptions() > uncaught_) return;  // no_sync_ restores the synchronisation
    try {
      finish();
    } catch (...) {
      std::cerr << "accel::local_sgd: the final averaging of the parameters failed when the scope ended, where no "
                   "error can be thrown: "
                << detail::failure_text(std::current_exception())
                << "\n(call finish() at the end of the scope to handle it)" << std::endl;
      std::terminate();
    }
  }

  /// Counts a step (call it after each optimizer step, on every process); every `local_sgd_steps`-th averages the
  /// model's parameters over the processes.
  void step() {
    require_open("step");
    ++num_steps_;
    if (enabled_ && num_steps_ % local_sgd_steps_ == 0) average();
  }

  /// Ends the scope: averages the parameters once more (Accelerate's `__exit__`) and gives the model back its
  /// gradient synchronisation, even when the averaging throws. A collective.
  void finish() {
    require_open("finish");
    finished_ = true;
    const auto restore = std::move(no_sync_);  // destroyed last: synchronisation returns after the averaging
    if (enabled_) average();
  }

  /// Steps counted so far.
  [[nodiscard]] std::int64_t num_steps() const noexcept { return num_steps_; }
  /// Whether the scope averages (asked for, and several processes); otherwise it only counts.
  [[nodiscard]] bool enabled() const noexcept { return enabled_; }

 private:
  /// Accelerate's `_sync_and_avg_model_params`: every process here, then the mean of the parameters.
  void average() {
    acc_->wait_for_everyone();
    detail::average_parameters(*acc_, module_->parameters());
  }
  void require_open(const char* call) const {
    if (finished_)
      throw std::logic_error(std::string("accel::local_sgd::") + call +
                             "() after finish(): the scope has ended; start a new local_sgd for another window");
  }

  Accelerator* acc_;
  const torch::nn::Module* module_;
  std::int64_t local_sgd_steps_;
  bool enabled_;
  std::int64_t num_steps_ = 0;
  bool finished_ = false;
  int uncaught_ = std::uncaught_exceptions();
  std::unique_ptr<no_sync_scope> no_sync_;
};

}  // namespace accel
