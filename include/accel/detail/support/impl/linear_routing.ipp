/// \file
/// What linear_routing.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../linear_routing.hpp"

#if ACCEL_HAS_LINEAR_ROUTING

namespace accel::detail::routing {

bool is_weight(const at::Tensor& operand, const at::Tensor& weight, bool transposed) {
  if (!operand.defined() || operand.dim() != 2) return false;
  if (!operand.is_alias_of(weight) || operand.storage_offset() != weight.storage_offset()) return false;
  const int first = transposed ? 1 : 0, second = 1 - first;
  return operand.size(0) == weight.size(first) && operand.size(1) == weight.size(second) &&
         operand.stride(0) == weight.stride(first) && operand.stride(1) == weight.stride(second);
}

std::optional<at::Tensor> first_route(std::vector<const linear_router*>::reverse_iterator router,
                                      const at::Tensor& input, const at::Tensor& operand, bool transposed,
                                      const at::Tensor* bias, const product_split* split) {
  for (; router != active_routers.rend(); ++router)
    if (auto out = (*router)->route(input, operand, transposed, bias, split)) return out;
  return std::nullopt;
}

std::optional<at::Tensor> route(const at::Tensor& input, const at::Tensor& operand, bool transposed,
                                const at::Tensor* bias) {
  return first_route(active_routers.rbegin(), input, operand, transposed, bias, nullptr);
}

at::Tensor linear_outside(const linear_router& inner, const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor* bias, const product_split& split) {
  auto router = std::find(active_routers.rbegin(), active_routers.rend(), &inner);
  if (router != active_routers.rend()) ++router;
  if (auto out = first_route(router, input, weight, false, bias, &split)) return *std::move(out);
  return at::linear(input, weight, bias != nullptr ? *bias : at::Tensor());
}

at::Tensor routed_linear(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  c10::impl::ExcludeDispatchKeyGuard outside(routing_key);
  const at::Tensor* added = bias && bias->defined() ? &*bias : nullptr;
  if (auto out = route(input, weight, false, added)) return *std::move(out);
  return at::linear(input, weight, bias);
}

at::Tensor routed_addmm(const at::Tensor& bias, const at::Tensor& input, const at::Tensor& weight_t,
                        const c10::Scalar& beta, const c10::Scalar& alpha) {
  c10::impl::ExcludeDispatchKeyGuard outside(routing_key);
  const bool plain = bias.dim() == 1 && beta.equal(1) && alpha.equal(1);
  if (plain)
    if (auto out = route(input, weight_t, true, &bias)) return *std::move(out);
  return at::addmm(bias, input, weight_t, beta, alpha);
}

at::Tensor routed_embedding(const at::Tensor& weight, const at::Tensor& indices, c10::SymInt padding_idx,
                            bool scale_grad_by_freq, bool sparse) {
  c10::impl::ExcludeDispatchKeyGuard outside(routing_key);
  for (auto router = active_routers.rbegin(); router != active_routers.rend(); ++router)
    if (auto out = (*router)->route_embedding(weight, indices)) return *std::move(out);
  return at::embedding_symint(weight, indices, std::move(padding_idx), scale_grad_by_freq, sparse);
}

at::Tensor routed_matmul(const at::Tensor& input, const at::Tensor& weight_t) {
  c10::impl::ExcludeDispatchKeyGuard outside(routing_key);
  if (input.dim() >= 1)
    if (auto out = route(input, weight_t, true, nullptr)) return *std::move(out);
  return at::matmul(input, weight_t);
}

void install_routing() {
  static const bool installed = [] {
    if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(routing_key))
      throw std::runtime_error(
          "accel routes Linear layers (fp8, tensor parallelism) through LibTorch's AutocastPrivateUse1 dispatch key, "
          "which something else in this process (a PrivateUse1 device backend) already uses");
    auto* fallback = new torch::Library(torch::Library::IMPL, "_", routing_key, __FILE__, __LINE__);
    fallback->fallback(torch::CppFunction::makeFallthrough());
    auto* kernels = new torch::Library(torch::Library::IMPL, "aten", routing_key, __FILE__, __LINE__);
    kernels->impl("linear", TORCH_FN(routed_linear));
    kernels->impl("addmm", TORCH_FN(routed_addmm));
    kernels->impl("matmul", TORCH_FN(routed_matmul));
    kernels->impl("embedding", TORCH_FN(routed_embedding));
    return true;
  }();
  (void)installed;
}

routing_scope::routing_scope(const linear_router& router)
    : was_included_(c10::impl::tls_is_dispatch_key_included(routing_key)),
      was_excluded_(c10::impl::tls_is_dispatch_key_excluded(routing_key)) {
  active_routers.push_back(&router);
  c10::impl::tls_set_dispatch_key_excluded(routing_key, false);
  c10::impl::tls_set_dispatch_key_included(routing_key, true);
}

routing_scope::~routing_scope() {
  c10::impl::tls_set_dispatch_key_included(routing_key, was_included_);
  c10::impl::tls_set_dispatch_key_excluded(routing_key, was_excluded_);
  active_routers.pop_back();
}

}  // namespace accel::detail::routing

#endif  // ACCEL_HAS_LINEAR_ROUTING
