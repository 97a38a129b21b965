/// \file
/// `prepared_model`: what `accelerator::prepare` returns for a model. Calling it runs the user's forward under
/// the accelerator's precision policy; `->` reaches the user's module.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "detail/prepared/accelerator_access.hpp"
#include "detail/prepared/prepared_handle.hpp"

#include <memory>
#include <type_traits>
#include <utility>

namespace accel {

/// A model `prepare` accepts: a `torch::nn::ModuleHolder<Impl>` (what `TORCH_MODULE` makes) or a
/// `std::shared_ptr<M>` with `M` derived from `torch::nn::Module`.
template <class M>
concept model_like =
    std::is_base_of_v<torch::detail::ModuleHolderIndicator, M> ||
    (requires { typename M::element_type; } && std::is_same_v<M, std::shared_ptr<typename M::element_type>> &&
     std::is_base_of_v<torch::nn::Module, typename M::element_type>);

namespace detail {
/// The module behind a model handle, non-const like the handle's own `shared_ptr` (ModuleHolder's `->` is const
/// when the holder is).
template <class Model>
auto* module_pointer(const Model& model) noexcept {
  if constexpr (std::is_base_of_v<torch::detail::ModuleHolderIndicator, Model>)
    return model.ptr().get();
  else
    return model.get();
}
/// The module of a model handle, shared.
template <class Model>
std::shared_ptr<torch::nn::Module> module_shared(const Model& model) {
  if constexpr (std::is_base_of_v<torch::detail::ModuleHolderIndicator, Model>)
    return model.ptr();
  else
    return model;
}
}  // namespace detail

template <model_like Model, class Accelerator>
class prepared_model : detail::prepared_tag {
 public:
  using model_type = Model;

  prepared_model(Model model, Accelerator& accelerator) : model_(std::move(model)), accelerator_(&accelerator) {}

  /// The user's `forward`, under the precision policy's scope (autocast for bf16/fp16, nothing for fp32) and the
  /// parallel policy's (tensor parallelism's split layers); bf16 and fp16 return float16/bfloat16 output tensors as
  /// float32, as Accelerate does.
  /// `model->forward(x)` reaches the module directly and so bypasses that scope: call `model(x)`.
  template <class... Args>
  decltype(auto) operator()(Args&&... args) const {
    auto* module = detail::module_pointer(model_);
    detail::accelerator_access::before_forward(*accelerator_, *module);
    [[maybe_unused]] auto scope = accelerator_->autocast();
    [[maybe_unused]] auto parallel_scope = detail::accelerator_access::parallel_forward_scope(*accelerator_);
    return detail::accelerator_access::forward_output(*accelerator_, module->forward(std::forward<Args>(args)...));
  }
  /// The same as `operator()`, for code that spells the call out.
  template <class... Args>
  decltype(auto) forward(Args&&... args) const {
    return (*this)(std::forward<Args>(args)...);
  }

  /// The user's module (`Impl*` for a ModuleHolder).
  [[nodiscard]] auto* operator->() const noexcept { return detail::module_pointer(model_); }
  [[nodiscard]] auto& operator*() const noexcept { return *detail::module_pointer(model_); }

  /// The model as the user gave it (what `accelerator::unwrap_model` returns): a handle sharing the module.
  [[nodiscard]] Model unwrap() const noexcept { return model_; }

 private:
  Model model_;
  Accelerator* accelerator_;
};

}  // namespace accel
