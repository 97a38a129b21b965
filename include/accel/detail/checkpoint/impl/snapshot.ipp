/// \file
/// What snapshot.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../snapshot.hpp"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <thread>

#include "../../support/archive.hpp"
#include "../../support/optimizer_state.hpp"
#include "../../support/scope.hpp"
#include "../archives.hpp"

namespace accel::detail {

at::Tensor snapshot_buffers::copy(const at::Tensor& live) {
  at::NoGradGuard no_grad;
  const bool from_device = live.is_cuda();  // then enqueued, not waited for (the class comment says why it is safe)
  if (from_device) copied_from_ = live.device();
  if (next_ < buffers_.size() && buffers_[next_].sizes() == live.sizes() &&
      buffers_[next_].scalar_type() == live.scalar_type())
    return buffers_[next_++].copy_(live, from_device);
  // Pinned memory is what a CUDA device copies into at full speed, and without blocking the host.
  auto fresh = at::empty(live.sizes(), at::TensorOptions().dtype(live.scalar_type()).pinned_memory(from_device));
  fresh.copy_(live, from_device);
  if (next_ < buffers_.size())
    buffers_[next_] = fresh;
  else
    buffers_.push_back(fresh);
  ++next_;
  return fresh;
}

void snapshot_buffers::finish() {
  buffers_.resize(next_);
  if (!copied_from_) return;
  // LibTorch 1.13's c10::Event cannot block on itself: the waiting thread polls it.
  auto copied = std::make_shared<c10::Event>(copied_from_->type());
  copied->record(c10::impl::VirtualGuardImpl(copied_from_->type()).getStream(*copied_from_));
  copies_done_ = [copied] {
    while (!copied->query()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  };
}

safetensors::tensor_list snapshot_copy(const safetensors::tensor_list& tensors, snapshot_buffers& buffers) {
  safetensors::tensor_list copies;
  copies.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) copies.emplace_back(name, buffers.copy(tensor));
  return copies;
}

void checkpoint_snapshot::shared_archive(const std::string& name, torch::serialize::OutputArchive& archive) {
  shared_.push_back({name, nullptr, serialised(archive)});
}

void checkpoint_snapshot::optimizer_archive(const std::string& name, torch::optim::Optimizer& optimizer) {
  // The optimizer saves copies of its state: each parameter's state is swapped for a copy while it saves, then put
  // back; LibTorch's archive keeps references to the tensors it is given, not their values.
  auto& states = optimizer.state();
  using state_ptr = std::unique_ptr<torch::optim::OptimizerParamState>;
  std::vector<std::pair<state_ptr*, state_ptr>> swapped;
  const auto put_back = scope_exit([&swapped] {
    for (auto& [slot, live] : swapped) *slot = std::move(live);
  });
  bool elementwise = true;
  for (auto& [key, state] : states) {
    auto copied = state->clone();
    elementwise = transform_state_tensors(*copied, [this](const at::Tensor& t) { return buffers_->copy(t); });
    if (!elementwise) break;
    swapped.emplace_back(&state, std::exchange(state, std::move(copied)));
  }
  auto archive = std::make_shared<torch::serialize::OutputArchive>();
  save_optimizer(optimizer, *archive);
  if (elementwise)
    shared_.push_back({name, std::move(archive), {}});
  else  // state of another kind (LBFGS's): its bytes are the copy
    shared_.push_back({name, nullptr, serialised(*archive)});
}

}  // namespace accel::detail
