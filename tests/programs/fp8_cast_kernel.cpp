// accel::fp8's cast kernel (include/accel/detail/fp8/cast_kernel.hpp) where the unit tests cannot reach it:
//   `fp8_cast_kernel nvrtc LIBNVRTC`: NVRTC (the library at LIBNVRTC, from the nvidia-cuda-nvrtc wheel: it runs
//   without a GPU) compiles the kernel's CUDA text for Ada, Hopper and Blackwell, as accel does at run time;
//   `fp8_cast_kernel cuda`: on a GPU, the kernel's two layouts against ATen's cast and transpose, bit for bit, for
//   each input type, float8 format and an assortment of shapes (scripts/gpu.sh runs it; `bench_fp8_step --parts`
//   times the two).
// Exits 77 (skipped) without the library or the GPU, saying which.
#include "accel_headers.hpp"
#include <accel/detail/fp8/cuda_casts.hpp>  // the kernel's launcher: compiled mode's accel.hpp has none
#include <dlfcn.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <filesystem>
#include <iostream>
#include <string>

namespace programs::fp8_cast_kernel {

#if ACCEL_HAS_FLOAT8
namespace {

namespace f = accel::detail::fp8;

int compile_with(const std::filesystem::path& library) {
  // Loaded as a CUDA LibTorch's link loads it; accel finds it there, and its builtins beside it.
  if (dlopen(library.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::cerr << "fp8_cast_kernel: skipped: cannot open " << library << " (" << dlerror()
              << "): pip install nvidia-cuda-nvrtc (requirements/test.txt)\n";
    return 77;
  }
  for (const auto& [major, minor] : {std::pair{8, 9}, {9, 0}, {10, 0}}) {
    const auto cubin = f::kernel::compile_cubin(major, minor);
    std::cout << "sm_" << major << minor << ": " << cubin.size() << " bytes of cubin\n";
    if (cubin.size() < 1024) return 1;
  }
  return 0;
}

/// The kernel's two layouts against the ATen path's (cast, then `.t().contiguous()`), bit for bit.
bool same_as_aten(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype) {
  const auto both = f::kernel::cast_both_layouts(x, scale, dtype);
  if (!both) throw std::runtime_error("the kernel did not run (LibTorch's warning above says why)");
  const auto rows = f::cast(x, scale, dtype);
  return torch::equal(both->first.view(at::kByte), rows.view(at::kByte)) &&
         torch::equal(both->second.view(at::kByte), rows.t().contiguous().view(at::kByte));
}

int on_cuda() {
  if (!torch::cuda::is_available()) {
    std::cerr << "fp8_cast_kernel: skipped: no GPU\n";
    return 77;
  }
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  int failures = 0;
  for (const auto type : {at::kBFloat16, at::kFloat, at::kHalf})
    for (const auto dtype : {at::kFloat8_e4m3fn, at::kFloat8_e5m2})
      for (const auto& [rows, cols] :
           {std::pair<int64_t, int64_t>{1, 16}, {37, 48}, {64, 64}, {130, 208}, {8192, 4096}}) {
        const auto x = (torch::randn({rows, cols}, cuda) * 100).to(type);
        const auto scale = torch::full({}, 3.7f, cuda);  // some products beyond the range: saturation too
        if (!same_as_aten(x, scale, dtype)) {
          std::cerr << "differs: " << type << " to " << dtype << ", " << rows << " x " << cols << "\n";
          ++failures;
        }
      }
  std::cout << "cast kernel against ATen on cuda: " << (failures == 0 ? "the same bits" : "DIFFERENT") << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace
#endif

int run(int argc, char** argv) {
#if !ACCEL_HAS_FLOAT8
  (void)argc, (void)argv;
  std::cerr << "fp8_cast_kernel: skipped: this LibTorch has no float8\n";
  return 77;
#else
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "nvrtc" && argc == 3) return compile_with(argv[2]);
    if (mode == "cuda") return on_cuda();
  } catch (const std::exception& error) {
    std::cerr << "fp8_cast_kernel: " << error.what() << "\n";
    return 1;
  }
  std::cerr << "usage: fp8_cast_kernel nvrtc LIBNVRTC | cuda\n";
  return 2;
#endif
}

}  // namespace programs::fp8_cast_kernel
