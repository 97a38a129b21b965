/// \file
/// What cuda_casts.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../cuda_casts.hpp"

#if ACCEL_HAS_FLOAT8
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>

#include "../../support/directory_entries.hpp"
#include "../cast_kernel.hpp"

namespace accel::detail::fp8::kernel {

namespace cuda_internals {
/// A symbol of a library already in the process (LibTorch's CUDA build links NVRTC and loads the CUDA runtime), or
/// of the first of `libraries` that opens; null if none has it.
inline void* find_symbol(const char* name, std::initializer_list<const char*> libraries) {
  if (void* found = dlsym(RTLD_DEFAULT, name)) return found;
  for (const char* library : libraries)
    if (void* handle = dlopen(library, RTLD_NOW | RTLD_GLOBAL))
      if (void* found = dlsym(handle, name)) return found;
  return nullptr;
}

/// `slot` pointed at the function `name` (`find_symbol`); whether it was found.
template <class Function>
bool bind_symbol(Function*& slot, const char* name, std::initializer_list<const char*> libraries) {
  slot = reinterpret_cast<Function*>(find_symbol(name, libraries));
  return slot != nullptr;
}

/// The NVRTC calls the compilation makes (their C signatures; results are `nvrtcResult`, 0 for success).
struct nvrtc_api {
  using program = void*;
  int (*create)(program*, const char*, const char*, int, const char* const*, const char* const*);
  int (*compile)(program, int, const char* const*);
  int (*log_size)(program, std::size_t*);
  int (*log)(program, char*);
  int (*cubin_size)(program, std::size_t*);
  int (*cubin)(program, char*);
  int (*destroy)(program*);

  /// The process's NVRTC, or an error that says it was not found.
  static const nvrtc_api& get() {
    static const std::optional<nvrtc_api> api = load();
    if (!api) throw std::runtime_error("NVRTC (libnvrtc.so) is not loaded and could not be opened");
    return *api;
  }

 private:
  static std::optional<nvrtc_api> load() {
    const auto libraries = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    nvrtc_api api{};
    const bool found = bind_symbol(api.create, "nvrtcCreateProgram", libraries) &&
                       bind_symbol(api.compile, "nvrtcCompileProgram", libraries) &&
                       bind_symbol(api.log_size, "nvrtcGetProgramLogSize", libraries) &&
                       bind_symbol(api.log, "nvrtcGetProgramLog", libraries) &&
                       bind_symbol(api.cubin_size, "nvrtcGetCUBINSize", libraries) &&
                       bind_symbol(api.cubin, "nvrtcGetCUBIN", libraries) &&
                       bind_symbol(api.destroy, "nvrtcDestroyProgram", libraries);
    if (!found) return std::nullopt;
    load_builtins(reinterpret_cast<void*>(api.create));
    return api;
  }

  /// NVRTC opens its builtins library by name when it compiles, which finds it only on the loader's path; NVIDIA's
  /// wheel (PyTorch's dependency) puts it beside libnvrtc, off that path. Loaded from there first, it is found.
  static void load_builtins(void* nvrtc_function) {
    Dl_info info{};
    if (dladdr(nvrtc_function, &info) == 0 || info.dli_fname == nullptr) return;
    try {
      for (const auto& entry : directory_entries(std::filesystem::path(info.dli_fname).parent_path()))
        if (entry.path().filename().string().starts_with("libnvrtc-builtins.so"))
          dlopen(entry.path().c_str(), RTLD_NOW | RTLD_GLOBAL);
    } catch (const std::filesystem::filesystem_error&) {
      // an unreadable directory: NVRTC's own search is all there is, and its error will say what it missed
    }
  }
};

/// The CUDA driver calls the launch makes, from libcuda (results are `CUresult`, 0 for success).
struct driver_api {
  using handle = void*;
  int (*current_context)(handle*);
  int (*context_device)(int*);
  int (*attribute)(int*, int, int);
  int (*load_module)(handle*, const void*);
  int (*get_function)(handle*, handle, const char*);
  int (*launch)(handle, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, handle, void**, void**);
  int (*error_string)(int, const char**);
  int (*runtime_free)(void*);  // cudaFree, from LibTorch's CUDA runtime: `cudaFree(nullptr)` makes a context current

  static const driver_api& get() {
    static const std::optional<driver_api> api = load();
    if (!api) throw std::runtime_error("the CUDA driver (libcuda.so.1) or runtime could not be opened");
    return *api;
  }

  /// Throws what `result` means, when it is an error.
  void check(int result, const char* call) const {
    if (result == 0) return;
    const char* text = nullptr;
    error_string(result, &text);
    throw std::runtime_error(std::string(call) + ": " + (text ? text : "error " + std::to_string(result)));
  }

 private:
  static std::optional<driver_api> load() {
    const auto libraries = {"libcuda.so.1"};
    driver_api api{};
    const bool found = bind_symbol(api.current_context, "cuCtxGetCurrent", libraries) &&
                       bind_symbol(api.context_device, "cuCtxGetDevice", libraries) &&
                       bind_symbol(api.attribute, "cuDeviceGetAttribute", libraries) &&
                       bind_symbol(api.load_module, "cuModuleLoadData", libraries) &&
                       bind_symbol(api.get_function, "cuModuleGetFunction", libraries) &&
                       bind_symbol(api.launch, "cuLaunchKernel", libraries) &&
                       bind_symbol(api.error_string, "cuGetErrorString", libraries);
    if (!found) return std::nullopt;
    bind_symbol(api.runtime_free, "cudaFree", {});  // LibTorch's CUDA runtime; needed only without a context
    return api;
  }
};

/// The kernels on each device, compiled and loaded once (per device: a module belongs to its context).
class cuda_kernels {
 public:
  /// The kernel for `input` to `output` on the current context's device.
  driver_api::handle function(c10::DeviceIndex device, c10::ScalarType input, c10::ScalarType output) {
    const std::lock_guard lock(mutex_);
    auto& module = modules_[device];
    const auto& driver = driver_api::get();
    if (module == nullptr) {
      int major = 0, minor = 0, ordinal = 0;
      driver.check(driver.context_device(&ordinal), "cuCtxGetDevice");
      driver.check(driver.attribute(&major, 75, ordinal), "cuDeviceGetAttribute");  // compute capability major
      driver.check(driver.attribute(&minor, 76, ordinal), "cuDeviceGetAttribute");  // and minor
      const auto cubin = compile_cubin(major, minor);
      driver.check(driver.load_module(&module, cubin.data()), "cuModuleLoadData");
    }
    const auto name = kernel_name(input, output);
    auto& function = functions_[{device, name}];
    if (function == nullptr) driver.check(driver.get_function(&function, module, name.c_str()), "cuModuleGetFunction");
    return function;
  }

  static cuda_kernels& instance() {
    static cuda_kernels kernels;
    return kernels;
  }

 private:
  std::mutex mutex_;
  std::map<c10::DeviceIndex, driver_api::handle> modules_;
  std::map<std::pair<c10::DeviceIndex, std::string>, driver_api::handle> functions_;
};

/// Launches the cast of `x` (a CUDA matrix the kernel takes) on the current stream.
inline std::pair<at::Tensor, at::Tensor> launch(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype) {
  const c10::DeviceGuard on_device(x.device());
  const auto& driver = driver_api::get();
  driver_api::handle context = nullptr;
  driver.check(driver.current_context(&context), "cuCtxGetCurrent");
  // A thread that has not called CUDA yet has no current context: cudaFree(nullptr) makes the primary one current.
  if (context == nullptr) {
    if (driver.runtime_free == nullptr)
      throw std::runtime_error("no current CUDA context, and no cudaFree to make one");
    driver.check(driver.runtime_free(nullptr), "cudaFree");
  }
  const auto function = cuda_kernels::instance().function(x.device().index(), x.scalar_type(), dtype);
  const auto scale32 = scale.to(at::kFloat).contiguous();
  auto out = outputs_for(x, dtype);
  auto problem = problem_of(x, scale32, out);
  void* arguments[] = {&problem};
  const auto stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(x.device());
  driver.check(driver.launch(function, static_cast<unsigned>((x.size(0) + tile - 1) / tile),
                             static_cast<unsigned>((x.size(1) + tile - 1) / tile), 1, threads, 1, 1, 0,
                             stream.native_handle(), arguments, nullptr),
               "cuLaunchKernel");
  return out;
}

/// Whether casts on CUDA go through the kernel: yes, unless `ACCEL_FP8_CAST_KERNEL=0` (a diagnostic: ATen's casts,
/// to compare with) or it failed once on this process (NVRTC or the driver missing), which is warned once.
inline std::atomic<bool>& kernel_enabled() {
  static std::atomic<bool> enabled = [] {
    const char* setting = std::getenv("ACCEL_FP8_CAST_KERNEL");
    return setting == nullptr || std::string(setting) != "0";
  }();
  return enabled;
}

}  // namespace cuda_internals

std::string compile_cubin(int major, int minor) {
  using cuda_internals::nvrtc_api;
  const auto& nvrtc = nvrtc_api::get();
  const auto source = cuda_source();
  nvrtc_api::program program = nullptr;
  if (nvrtc.create(&program, source.c_str(), "accel_fp8_cast.cu", 0, nullptr, nullptr) != 0)
    throw std::runtime_error("nvrtcCreateProgram failed");
  const auto architecture = "--gpu-architecture=sm_" + std::to_string(major * 10 + minor);
  const char* options[] = {architecture.c_str(), "--std=c++17", "--fmad=false"};
  const int compiled = nvrtc.compile(program, 3, options);
  std::size_t size = 0;
  std::string text;
  if (compiled != 0) {
    nvrtc.log_size(program, &size);
    text.resize(size);
    nvrtc.log(program, text.data());
  } else {
    nvrtc.cubin_size(program, &size);
    text.resize(size);
    nvrtc.cubin(program, text.data());
  }
  nvrtc.destroy(&program);
  if (compiled != 0) throw std::runtime_error("NVRTC could not compile the kernel for " + architecture + ": " + text);
  return text;
}

std::optional<std::pair<at::Tensor, at::Tensor>> cast_both_layouts(const at::Tensor& x, const at::Tensor& scale,
                                                                   c10::ScalarType dtype) {
  if (!x.is_cuda() || !cuda_internals::kernel_enabled() || !takes(x)) return std::nullopt;
  try {
    return cuda_internals::launch(x, scale, dtype);
  } catch (const std::exception& error) {
    if (cuda_internals::kernel_enabled().exchange(false))
      TORCH_WARN("accel::fp8: float8 casts stay ATen's (two passes, no fused transpose): ", error.what());
    return std::nullopt;
  }
}

}  // namespace accel::detail::fp8::kernel

#endif  // ACCEL_HAS_FLOAT8
