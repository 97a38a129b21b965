/// \file
/// The cast of float8 training as one kernel: a tensor multiplied by its scale, saturated, rounded to float8 and
/// written in both layouts a Linear's three matmuls take (row-major, and its transpose, contiguous), in one pass.
/// ATen takes two: the product in TensorIterator's generic kernel, which neither vectorises nor coalesces when the
/// output converts, then the transpose, a strided byte copy (together 28 of an fp8 step's 107 ms at width 4096 on an
/// H200, docs/performance.md). The code is written once, as text that compiles both as C++ here (`on_host`, which
/// the tests compare with ATen's casts on the CPU) and as CUDA through NVRTC at run time (cuda_casts.hpp): a
/// header-only library needs no CUDA compiler.
// IWYU pragma: private, include <accel/fp8.hpp>
#pragma once

#include "../compat.hpp"  // ACCEL_HAS_FLOAT8: on a LibTorch without float8 this header declares nothing

// Outside the #if: every LibTorch has ATen (and the per-header check then precompiles it, tests/CMakeLists.txt).
#include <ATen/ATen.h>

#if ACCEL_HAS_FLOAT8
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace accel::detail::fp8::kernel {

/// The code both sides compile, here as C++ and as its own text (`shared_source`, for NVRTC). It may use only what
/// each side's prologue defines (`ACCEL_FP8_FUNCTION`, `float_bits`, `bits_float`, `load16`, `store16`), no
/// preprocessor lines and no library.
#define ACCEL_FP8_COMPILED_TWICE(...) \
  __VA_ARGS__                         \
  inline constexpr const char* shared_source = #__VA_ARGS__;

// The host's prologue.
#define ACCEL_FP8_FUNCTION inline
inline unsigned int float_bits(float value) { return std::bit_cast<unsigned int>(value); }
inline float bits_float(unsigned int bits) { return std::bit_cast<float>(bits); }
struct alignas(16) sixteen_bytes;
inline sixteen_bytes load16(const unsigned char* from);
inline void store16(unsigned char* to, const sixteen_bytes& bytes);

ACCEL_FP8_COMPILED_TWICE(
    struct alignas(16) sixteen_bytes { unsigned int word[4]; };

    /* The float8 formats: mantissa bits, exponent bias, and the largest finite value as float bits and as float8. */
    struct e4m3 {
      static constexpr int mantissa_bits = 3, bias = 7;
      static constexpr unsigned int largest_bits = 0x43e00000u, largest_code = 0x7eu; /* 448 */
    };
    struct e5m2 {
      static constexpr int mantissa_bits = 2, bias = 15;
      static constexpr unsigned int largest_bits = 0x47600000u, largest_code = 0x7bu; /* 57344 */
    };

    /* `kept` shifted right by `shift` (1 to 24), rounded to nearest, ties to even. */
    ACCEL_FP8_FUNCTION unsigned int rounded_shift(unsigned int kept, unsigned int shift) {
      const unsigned int quotient = kept >> shift, rest = kept & ((1u << shift) - 1u), half = 1u << (shift - 1u);
      return quotient + ((rest > half || (rest == half && (quotient & 1u) != 0u)) ? 1u : 0u);
    }

    /* `value` in float8, rounded to nearest even and saturated at the largest finite value, infinities included (a
       clamp to the format's range, then the conversion, as torchao and TransformerEngine cast); NaN stays NaN. */
    template <class Format>
    ACCEL_FP8_FUNCTION unsigned char to_float8(float value) {
      const unsigned int bits = float_bits(value), sign = (bits >> 24) & 0x80u, magnitude = bits & 0x7fffffffu;
      if (magnitude > 0x7f800000u) return static_cast<unsigned char>(sign | 0x7fu);
      if (magnitude >= Format::largest_bits) return static_cast<unsigned char>(sign | Format::largest_code);
      if ((magnitude >> 23) == 0u) return static_cast<unsigned char>(sign); /* below float8's subnormals */
      const int exponent = static_cast<int>(magnitude >> 23) - 127 + Format::bias;
      unsigned int code = 0u;
      if (exponent >= 1) { /* normal: the exponent and mantissa shifted together, so a carry rounds into it */
        code = rounded_shift((static_cast<unsigned int>(exponent) << 23) | (magnitude & 0x7fffffu),
                             static_cast<unsigned int>(23 - Format::mantissa_bits));
      } else { /* subnormal: the significand shifted to the float8's unit */
        const int shift = 24 - Format::mantissa_bits - exponent;
        if (shift > 24) return static_cast<unsigned char>(sign);
        code = rounded_shift((magnitude & 0x7fffffu) | 0x800000u, static_cast<unsigned int>(shift));
      }
      return static_cast<unsigned char>(sign | code);
    }

    /* Sixteen consecutive elements of an input type, read as 16-byte chunks and widened to float exactly. */
    struct from_float {
      static constexpr int bytes = 4;
      ACCEL_FP8_FUNCTION static float widen(const sixteen_bytes* chunks, int i) {
        return bits_float(chunks[i / 4].word[i % 4]);
      }
    };
    struct from_bfloat16 {
      static constexpr int bytes = 2;
      ACCEL_FP8_FUNCTION static float widen(const sixteen_bytes* chunks, int i) {
        const unsigned int pair = chunks[i / 8].word[(i % 8) / 2];
        return bits_float((i % 2 == 0 ? pair & 0xffffu : pair >> 16) << 16);
      }
    };
    struct from_half {
      static constexpr int bytes = 2;
      ACCEL_FP8_FUNCTION static float widen(const sixteen_bytes* chunks, int i) {
        const unsigned int pair = chunks[i / 8].word[(i % 8) / 2], h = i % 2 == 0 ? pair & 0xffffu : pair >> 16;
        const unsigned int sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
        if (exponent == 0u) { /* zero or subnormal: mantissa * 2^-24, exact in float */
          const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
          return bits_float(sign | float_bits(magnitude));
        }
        if (exponent == 31u) return bits_float(sign | 0x7f800000u | (mantissa << 13));
        return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
      }
    };

    /* A block's share of a (rows x cols) cast: a tile of 64 x 64, 256 threads, each 16 elements of one row. */
    constexpr int tile = 64,
    tile_pitch = 68, threads = 256; /* pitch: 4 bytes more, fewer shared-memory conflicts */

    struct cast_problem {
      const unsigned char* x;
      const float* scale;
      unsigned char* rows_out;    /* rows x cols */
      unsigned char* columns_out; /* cols x rows: the transpose */
      long long rows;
      long long cols; /* a multiple of 16, the rows 16-byte aligned */
    };

    /* The first half: thread `t`'s 16 elements cast and stored row-major, and kept in the tile transposed. */
    template <class Input, class Format>
    ACCEL_FP8_FUNCTION void cast_part(const cast_problem& p, unsigned char (*tile_bytes)[tile_pitch],
                                      long long tile_row, long long tile_col, int t) {
      const long long row = tile_row + t / 4, col = tile_col + (t % 4) * 16;
      if (row >= p.rows || col >= p.cols) return;
      sixteen_bytes chunks[Input::bytes];
      for (int k = 0; k < Input::bytes; ++k) chunks[k] = load16(p.x + ((row * p.cols + col) * Input::bytes + 16 * k));
      const float scale = *p.scale;
      sixteen_bytes out = {{0u, 0u, 0u, 0u}};
      for (int i = 0; i < 16; ++i) {
        const unsigned char code = to_float8<Format>(Input::widen(chunks, i) * scale);
        out.word[i / 4] |= static_cast<unsigned int>(code) << (8 * (i % 4));
        tile_bytes[(t % 4) * 16 + i][t / 4] = code;
      }
      store16(p.rows_out + (row * p.cols + col), out);
    }

    /* The second half, once the tile is whole: thread `t` writes 16 elements of one row of the transpose. */
    ACCEL_FP8_FUNCTION void transpose_part(const cast_problem& p, const unsigned char (*tile_bytes)[tile_pitch],
                                           long long tile_row, long long tile_col, int t) {
      const long long column = tile_col + t / 4, first = tile_row + (t % 4) * 16;
      if (column >= p.cols || first >= p.rows) return;
      const unsigned char* from = tile_bytes[t / 4] + (t % 4) * 16;
      unsigned char* to = p.columns_out + (column * p.rows + first);
      if (p.rows % 16 == 0) {
        sixteen_bytes out = {{0u, 0u, 0u, 0u}};
        for (int i = 0; i < 16; ++i) out.word[i / 4] |= static_cast<unsigned int>(from[i]) << (8 * (i % 4));
        store16(to, out);
      } else {
        for (int i = 0; i < 16 && first + i < p.rows; ++i) to[i] = from[i];
      }
    })

inline sixteen_bytes load16(const unsigned char* from) {
  sixteen_bytes bytes;
  std::memcpy(&bytes, from, sizeof bytes);
  return bytes;
}
inline void store16(unsigned char* to, const sixteen_bytes& bytes) { std::memcpy(to, &bytes, sizeof bytes); }

#undef ACCEL_FP8_COMPILED_TWICE
#undef ACCEL_FP8_FUNCTION

/// What the kernels read and write, each type with its name in the shared code (and in the kernels' names): one list
/// for the CUDA program, the kernels' names and `takes`.
struct kernel_type {
  c10::ScalarType type;
  const char* name;
};
inline constexpr kernel_type kernel_inputs[] = {
    {at::kFloat, "from_float"}, {at::kBFloat16, "from_bfloat16"}, {at::kHalf, "from_half"}};
inline constexpr kernel_type kernel_outputs[] = {{at::kFloat8_e4m3fn, "e4m3"}, {at::kFloat8_e5m2, "e5m2"}};

/// The name of `type` in `types`, or null.
template <std::size_t N>
const char* name_in(const kernel_type (&types)[N], c10::ScalarType type) {
  for (const auto& entry : types)
    if (entry.type == type) return entry.name;
  return nullptr;
}

/// The kernels' names: one per input type and float8 format, `extern "C"` so that the driver finds them by name.
inline std::string kernel_name(c10::ScalarType input, c10::ScalarType output) {
  return std::string("accel_cast_") + name_in(kernel_inputs, input) + "_" + name_in(kernel_outputs, output);
}

/// The CUDA program NVRTC compiles: the device's prologue, the shared code, and a kernel per input and format.
inline std::string cuda_source() {
  std::string source = R"cuda(
#define ACCEL_FP8_FUNCTION __device__ __forceinline__
__device__ __forceinline__ unsigned int float_bits(float value) { return __float_as_uint(value); }
__device__ __forceinline__ float bits_float(unsigned int bits) { return __uint_as_float(bits); }
struct sixteen_bytes;
__device__ __forceinline__ sixteen_bytes load16(const unsigned char* from);
__device__ __forceinline__ void store16(unsigned char* to, const sixteen_bytes& bytes);
)cuda";
  source += shared_source;
  source += R"cuda(
__device__ __forceinline__ sixteen_bytes load16(const unsigned char* from) {
  return *reinterpret_cast<const sixteen_bytes*>(from);
}
__device__ __forceinline__ void store16(unsigned char* to, const sixteen_bytes& bytes) {
  *reinterpret_cast<sixteen_bytes*>(to) = bytes;
}
template <class Input, class Format> __device__ __forceinline__ void cast_transpose(const cast_problem& p) {
  __shared__ unsigned char tile_bytes[tile][tile_pitch];
  const long long tile_row = static_cast<long long>(blockIdx.x) * tile;
  const long long tile_col = static_cast<long long>(blockIdx.y) * tile;
  cast_part<Input, Format>(p, tile_bytes, tile_row, tile_col, static_cast<int>(threadIdx.x));
  __syncthreads();
  transpose_part(p, tile_bytes, tile_row, tile_col, static_cast<int>(threadIdx.x));
}
)cuda";
  for (const auto& input : kernel_inputs)
    for (const auto& output : kernel_outputs)
      source += "extern \"C\" __global__ void __launch_bounds__(threads) " + kernel_name(input.type, output.type) +
                "(cast_problem p) { cast_transpose<" + input.name + ", " + output.name + ">(p); }\n";
  return source;
}

/// Whether the kernel takes `x`: a contiguous matrix of float, bfloat16 or float16 whose rows are whole 16-byte
/// chunks (columns a multiple of 16, as a float8 Linear's are), on a grid CUDA can launch.
inline bool takes(const at::Tensor& x) {
  return x.dim() == 2 && x.is_contiguous() && name_in(kernel_inputs, x.scalar_type()) != nullptr &&
         x.size(1) % 16 == 0 && reinterpret_cast<std::uintptr_t>(x.data_ptr()) % 16 == 0 && x.size(0) > 0 &&
         x.size(1) > 0 && (x.size(1) + tile - 1) / tile <= 65535;
}

/// The two outputs of a cast, and the problem that describes it to either side.
inline std::pair<at::Tensor, at::Tensor> outputs_for(const at::Tensor& x, c10::ScalarType dtype) {
  return {at::empty(x.sizes(), x.options().dtype(dtype)), at::empty({x.size(1), x.size(0)}, x.options().dtype(dtype))};
}
inline cast_problem problem_of(const at::Tensor& x, const at::Tensor& scale, std::pair<at::Tensor, at::Tensor>& out) {
  return {static_cast<const unsigned char*>(x.data_ptr()),
          scale.data_ptr<float>(),
          static_cast<unsigned char*>(out.first.data_ptr()),
          static_cast<unsigned char*>(out.second.data_ptr()),
          x.size(0),
          x.size(1)};
}

/// The kernel run on the CPU, block by block and thread by thread, each half after the other as `__syncthreads`
/// orders them: what the tests compare with ATen's cast and transpose.
template <class Input, class Format>
void run_on_host(const cast_problem& p) {
  unsigned char tile_bytes[tile][tile_pitch] = {};
  for (long long tile_row = 0; tile_row < p.rows; tile_row += tile)
    for (long long tile_col = 0; tile_col < p.cols; tile_col += tile) {
      for (int t = 0; t < threads; ++t) cast_part<Input, Format>(p, tile_bytes, tile_row, tile_col, t);
      for (int t = 0; t < threads; ++t) transpose_part(p, tile_bytes, tile_row, tile_col, t);
    }
}

/// `on_host(x, scale, dtype)`: x (on the CPU, `takes(x)`) times the float32 scalar `scale`, in float8 `dtype`, and
/// its transpose, by the kernel's code.
inline std::pair<at::Tensor, at::Tensor> on_host(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype) {
  if (!x.device().is_cpu() || !takes(x)) throw std::invalid_argument("kernel::on_host: a CPU matrix the kernel takes");
  const auto scale32 = scale.to(at::kFloat).contiguous();
  auto out = outputs_for(x, dtype);
  const auto p = problem_of(x, scale32, out);
  const bool e5 = dtype == at::kFloat8_e5m2;
  switch (x.scalar_type()) {
    case at::kFloat:
      e5 ? run_on_host<from_float, e5m2>(p) : run_on_host<from_float, e4m3>(p);
      break;
    case at::kBFloat16:
      e5 ? run_on_host<from_bfloat16, e5m2>(p) : run_on_host<from_bfloat16, e4m3>(p);
      break;
    default:
      e5 ? run_on_host<from_half, e5m2>(p) : run_on_host<from_half, e4m3>(p);
  }
  return out;
}

}  // namespace accel::detail::fp8::kernel

#endif  // ACCEL_HAS_FLOAT8
