/// \file
/// Every difference between the LibTorch versions accel supports (Debian's 1.13 and PyTorch 2.x) lives here:
/// the autograd node handle, `zero_grad(set_to_none)`, the autocast state functions and what autocast supports,
/// the fused unscale kernel, Gloo's flat all-gather, LibTorch's current CUDA stream for NCCL, emptying the device
/// cache and reading its memory counters, the CPU allocator's interface, the profiler's event times and Chrome
/// traces, whether Gloo sums bfloat16, whether the CPU multiplies float16 matrices, how a generator state is
/// checked, and whether float8 exists.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include "config.hpp"

#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR < 2
#include <c10/util/string_utils.h>  // c10::guts::to_string, 1.13's optimizer state keys
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#if TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR >= 209
#include <ATen/DeviceAccelerator.h>  // at::accelerator::emptyCache
#endif

#ifdef ACCEL_WITH_NCCL
#include <cuda_runtime.h>
#if ACCEL_TORCH_CUDA  // a LibTorch built with CUDA (PyTorch's), set by the accel::nccl CMake target
#include <c10/cuda/CUDAStream.h>
#if TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR < 209
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>
#endif
#endif
#endif

/// LibTorch's version as MAJOR * 100 + MINOR (113 for 1.13, 204 for 2.4).
#define ACCEL_TORCH_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)

/// Whether this LibTorch has what `accel::fp8` computes with: the float8 types (`at::kFloat8_e4m3fn`,
/// `at::kFloat8_e5m2`, from 2.1) and `at::_scaled_mm` taking its scales and returning one tensor (2.4 on; 2.1-2.3
/// returned the output and an amax). LibTorch 1.13 has neither. Checked on 2.13, where `_scaled_mm` runs on the CPU
/// too (tensorwise and rowwise scales, e4m3 and e5m2 operands, bfloat16 and float32 outputs).
#define ACCEL_HAS_FLOAT8 (ACCEL_TORCH_VERSION >= 204)

/// Whether this LibTorch has the dispatch key that accel routes Linear layers through (`AutocastPrivateUse1`,
/// detail/support/linear_routing.hpp: fp8 and tensor parallelism). LibTorch 1.13 has no such key; checked on 2.13.
#define ACCEL_HAS_LINEAR_ROUTING (ACCEL_TORCH_VERSION >= 204)

/// Whether this LibTorch has its fused CPU attention that returns the log-sum-exp and takes a mask
/// (`_scaled_dot_product_flash_attention_for_cpu` and its backward, which takes the whole output and log-sum-exp):
/// context parallelism's local attention on the CPU. 1.13 has none (accel's float32 math instead); checked on 2.13.
#define ACCEL_HAS_CPU_FLASH_ATTENTION (ACCEL_TORCH_VERSION >= 205)

namespace accel::detail::compat {

/// The owning handle of a leaf's gradient accumulator node: `std::shared_ptr<Node>` in 1.13,
/// `c10::intrusive_ptr<Node>` in 2.x (autograd nodes became intrusive). Taken from the function's own return type,
/// so no version test is needed.
using grad_accumulator_handle = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

/// `Optimizer::zero_grad(set_to_none)`: 2.x has the flag; 1.13 only zeroes in place.
inline void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
#if ACCEL_TORCH_VERSION >= 200
  optimizer.zero_grad(set_to_none);
#else
  if (!set_to_none) {
    optimizer.zero_grad();
    return;
  }
  for (auto& group : optimizer.param_groups())
    for (auto& parameter : group.params()) parameter.mutable_grad().reset();
#endif
}

/// Starts an all-gather of every process's `input` into the flat `output` (process r's at [r * n, (r + 1) * n)) on
/// a c10d process group: `_allgather_base` in 2.x; 1.13's Gloo has none, so the list form writes into views of it.
template <class Group>
auto all_gather_into(Group& group, at::Tensor& output, at::Tensor& input) {
#if ACCEL_TORCH_VERSION >= 200
  return group._allgather_base(output, input);
#else
  std::vector<std::vector<at::Tensor> > outputs{output.chunk(group.getSize())};
  std::vector<at::Tensor> inputs{input};
  return group.allgather(outputs, inputs);
#endif
}

/// The key of a parameter's entry in `Optimizer::state()`: its TensorImpl's address in 2.x, that address as text
/// in 1.13.
inline auto optimizer_state_key(const at::Tensor& parameter) {
#if ACCEL_TORCH_VERSION >= 200
  return static_cast<void*>(parameter.unsafeGetTensorImpl());
#else
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
#endif
}

// Autocast state per device type (compiled once: ATen/autocast_mode.h is heavy). 1.13 has one function per device
// (CUDA's named "gpu"); 2.4 takes the device type and deprecates the old names, which 2.0-2.3 still have alone. Only
// CPU and CUDA are used by accel.

ACCEL_DECL bool autocast_enabled(c10::DeviceType device);
ACCEL_DECL void set_autocast_enabled(c10::DeviceType device, bool enabled);
ACCEL_DECL c10::ScalarType autocast_dtype(c10::DeviceType device);
ACCEL_DECL void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype);

/// Whether this LibTorch autocasts to `dtype` on `device`: CUDA to float16 and bfloat16; the CPU to bfloat16, and
/// to float16 from 2.4 on (1.13 refuses: "AutocastCPU only support Bfloat16").
inline bool autocast_supports(c10::DeviceType device, c10::ScalarType dtype) {
  if (device == c10::DeviceType::CUDA) return dtype == c10::kHalf || dtype == c10::kBFloat16;
  if (device == c10::DeviceType::CPU)
    return dtype == c10::kBFloat16 || (ACCEL_TORCH_VERSION >= 204 && dtype == c10::kHalf);
  return false;
}

/// Whether `_amp_foreach_non_finite_check_and_unscale_` (one fused pass over all gradients) has a kernel for
/// gradients on `device`: CUDA always; the CPU from 2.3 on (where `torch.amp.GradScaler("cpu")` appeared).
inline bool fused_unscale_available(c10::DeviceType device) {
  return device == c10::DeviceType::CUDA || (device == c10::DeviceType::CPU && ACCEL_TORCH_VERSION >= 203);
}

/// Releases the device memory LibTorch's caching allocator keeps unused (`torch.accelerator.empty_cache()`, what
/// Accelerate's `clear_device_cache` calls): from 2.9 through `at::accelerator` (CUDA, XPU, MPS, ...; checked on
/// 2.13; the call appeared around 2.8), where an accelerator is present. Before 2.9 only CUDA's allocator is reached,
/// and only where the CUDA headers are (the `accel::nccl` target with a CUDA LibTorch); a CPU LibTorch (Debian's
/// 1.13) keeps no device cache, so there is nothing to release.
inline void empty_device_cache() {
#if ACCEL_TORCH_VERSION >= 209
  if (at::accelerator::getAccelerator(false).has_value() && at::accelerator::deviceCount() > 0)
    at::accelerator::emptyCache();
#elif defined(ACCEL_WITH_NCCL) && ACCEL_TORCH_CUDA
  if (torch::cuda::is_available()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

/// The device caching allocator's byte counters (all pools together): what `torch.cuda.memory_allocated()`,
/// `max_memory_allocated()`, `memory_reserved()` and `max_memory_reserved()` read (`accel::memory_stats`).
struct device_memory_counters {
  std::int64_t allocated = 0;
  std::int64_t peak_allocated = 0;
  std::int64_t reserved = 0;
  std::int64_t peak_reserved = 0;
};

/// The counters of `device`'s caching allocator, or nothing where this LibTorch cannot reach one: from 2.9 through
/// `at::accelerator` (checked on 2.13: compiled, not run, as this machine has no GPU), where `device` is of the
/// accelerator's type; before, CUDA's allocator where the CUDA headers are (the `accel::nccl` target with a CUDA
/// LibTorch). A CPU LibTorch (Debian's 1.13) has no device allocator.
inline std::optional<device_memory_counters> device_memory(const c10::Device& device) {
#if ACCEL_TORCH_VERSION >= 209
  const auto accelerator = at::accelerator::getAccelerator(false);
  if (!accelerator || *accelerator != device.type() || at::accelerator::deviceCount() == 0) return std::nullopt;
  // As torch.accelerator.memory_stats: an allocator that has allocated nothing yet has nothing to report (and its
  // statistics cannot be read).
  if (!c10::getDeviceAllocator(device.type())->initialized()) return device_memory_counters{};
  const auto index = device.has_index() ? device.index() : at::accelerator::getDeviceIndex();
  const auto stats = at::accelerator::getDeviceStats(index);
#elif defined(ACCEL_WITH_NCCL) && ACCEL_TORCH_CUDA
  if (device.type() != c10::DeviceType::CUDA || !torch::cuda::is_available()) return std::nullopt;
  const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
#else
  (void)device;
  return std::nullopt;
#endif
#if ACCEL_TORCH_VERSION >= 209 || (defined(ACCEL_WITH_NCCL) && ACCEL_TORCH_CUDA)
  constexpr std::size_t all_pools = 0;  // StatType::AGGREGATE
  return device_memory_counters{.allocated = stats.allocated_bytes[all_pools].current,
                                .peak_allocated = stats.allocated_bytes[all_pools].peak,
                                .reserved = stats.reserved_bytes[all_pools].current,
                                .peak_reserved = stats.reserved_bytes[all_pools].peak};
#endif
}

/// Resets the peaks of `device`'s caching allocator to its current values; false where `device_memory` has none.
inline bool reset_device_memory_peaks(const c10::Device& device) {
  if (!device_memory(device)) return false;
#if ACCEL_TORCH_VERSION >= 209
  if (c10::getDeviceAllocator(device.type())->initialized())
    at::accelerator::resetPeakStats(device.has_index() ? device.index() : at::accelerator::getDeviceIndex());
#elif defined(ACCEL_WITH_NCCL) && ACCEL_TORCH_CUDA
  c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : c10::cuda::current_device());
#endif
  return true;
}

/// `c10::Allocator` as this LibTorch declares it, for an allocator `Derived` whose `allocate_bytes(n) const` does the
/// work: `allocate` is const in 1.13 and not in 2.x, which adds the pure `copy_data` (told apart by `allocate`'s own
/// type, so no version test is needed). The const case takes its base from the member pointer's class, so that a
/// compiler that checks `override` before instantiation (Clang) checks it only where this LibTorch selects the case.
template <class Derived, class Allocate = decltype(&c10::Allocator::allocate)>
struct allocator_interface;
template <class Derived, class Allocator>
struct allocator_interface<Derived, c10::DataPtr (Allocator::*)(std::size_t) const> : Allocator {
  c10::DataPtr allocate(std::size_t bytes) const override {
    return static_cast<const Derived&>(*this).allocate_bytes(bytes);
  }
};
template <class Derived>
struct allocator_interface<Derived, c10::DataPtr (c10::Allocator::*)(std::size_t)> : c10::Allocator {
  c10::DataPtr allocate(std::size_t bytes) override { return static_cast<const Derived&>(*this).allocate_bytes(bytes); }
  void copy_data(void* destination, const void* source, std::size_t count) const override {
    std::memcpy(destination, source, count);
  }
};

// The profiler (accel/profiler.hpp). The functions take the event type as a template parameter, so that this header
// does not include the profiler's.

/// A profiler event's start and duration in nanoseconds: 2.x's `KinetoEvent` counts nanoseconds (`startNs`), 1.13's
/// microseconds (`startUs`).
template <class Event>
std::int64_t profiler_event_start_ns(const Event& event) {
  if constexpr (requires { event.startNs(); })
    return static_cast<std::int64_t>(event.startNs());
  else
    return static_cast<std::int64_t>(event.startUs()) * 1000;
}
template <class Event>
std::int64_t profiler_event_duration_ns(const Event& event) {
  if constexpr (requires { event.durationNs(); })
    return static_cast<std::int64_t>(event.durationNs());
  else
    return static_cast<std::int64_t>(event.durationUs()) * 1000;
}

/// Whether LibTorch's profiler writes Chrome traces itself (`ProfilerResult::save`, through Kineto): PyTorch's 2.x
/// builds do. Debian's 1.13 is built without Kineto (its `save` throws "Saving a trace requires using torch.profiler
/// with Kineto support (USE_KINETO=1)"), though it records the same events: accel writes their trace there.
inline constexpr bool profiler_saves_traces = ACCEL_TORCH_VERSION >= 200;

/// Whether LibTorch's Gloo all-reduces bfloat16 (the bf16 communication hook): 2.13's does; 1.13's fails with
/// "Invalid scalar type" (both measured).
inline constexpr bool gloo_sums_bfloat16 = ACCEL_TORCH_VERSION >= 200;

/// Checks, without changing `generator`, that `state` would set it; throws LibTorch's error otherwise. On 2.x by
/// setting it on a clone; LibTorch 1.13's `Generator::clone()` leaks its copy (about 2.7 kB a call, 10 MB over 2,000
/// loads), so there the state's dtype and size are compared with the generator's own state's, which is what its
/// `set_state` checks first.
inline void check_generator_state(const at::Generator& generator, const at::Tensor& state) {
#if ACCEL_TORCH_VERSION >= 200
  generator.clone().set_state(state);
#else
  const auto own = generator.get_state();
  TORCH_CHECK(state.scalar_type() == own.scalar_type() && state.numel() == own.numel(), "a state of ", state.numel(),
              " ", state.scalar_type(), " elements where the generator's has ", own.numel(), " ", own.scalar_type());
#endif
}
/// Whether LibTorch multiplies float16 matrices on the CPU (PowerSGD under `comm_wrapper::fp16` on Gloo): 2.13 does;
/// 1.13 fails with `"addmm_impl_cpu_" not implemented for 'Half'` (both measured). Reports show 2.1 failing too; the
/// kernels arrived with 2.2's float16 CPU support, so 2.2 is where this takes them to start.
inline constexpr bool cpu_multiplies_float16 = ACCEL_TORCH_VERSION >= 202;

#ifdef ACCEL_WITH_NCCL
/// LibTorch's current CUDA stream on `device`, which NCCL work must be ordered with. A LibTorch without CUDA
/// (Debian's) has no CUDA tensors, so the legacy default stream is as good as any there.
inline cudaStream_t current_cuda_stream(c10::DeviceIndex device) {
#if ACCEL_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(device).stream();
#else
  (void)device;
  return cudaStreamLegacy;
#endif
}
#endif

}  // namespace accel::detail::compat

#if ACCEL_HEADER_ONLY
#include "impl/compat.ipp"
#endif
