/// \file
/// `parameter_encoding`: what a precision policy offers a parallel policy that gathers parameters from their shards
/// (fully_sharded), so that some parameters travel in a smaller type which the precision policy's forward computes
/// with as it comes (fp8's float8 all-gather, torchao's `enable_fsdp_float8_all_gather`). The seam between the two
/// families: neither names the other, the accelerator hands one to the other at prepare (`gather_encoding()`, a
/// precision hook; `use_gather_encoding(encoding)`, a parallel one).
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace accel::detail {

/// How the parameters it `encodes` are gathered before a forward. Per gather of a bucket of them, the parallel
/// policy takes `local_maximum` of each of this process's slices, max-reduces them across processes (one
/// all-reduce), `encode`s each slice with its reduced maximum, all-gathers the encoded elements and hands each
/// parameter's full encoded elements to `gathered`; `released` when it lets the parameter go. Meanwhile the
/// parameter holds them `decode`d, for any other reader (the precision policy's forward takes what `gathered`
/// received). Gathers for anything but a forward (checkpoints, unwrapping) are in the parameter's own type.
class parameter_encoding {
 public:
  virtual ~parameter_encoding() = default;
  /// Whether `parameter` (a model parameter) is gathered encoded; asked once, when its shards are made.
  [[nodiscard]] virtual bool encodes(const at::Tensor& parameter) const = 0;
  /// The type of the encoded elements: one of them per element of the parameter.
  [[nodiscard]] virtual c10::ScalarType encoded_type() const = 0;
  /// What this process's slice (flat, possibly empty) contributes to the max-reduction: a float32 scalar.
  [[nodiscard]] virtual at::Tensor local_maximum(const at::Tensor& slice) const = 0;
  /// `slice` encoded, given the processes' maximum for its parameter: `encoded_type()`, as many elements.
  [[nodiscard]] virtual at::Tensor encode(const at::Tensor& slice, const at::Tensor& maximum) const = 0;
  /// What the parameter holds while gathered encoded: `encoded` (its shape) decoded into its own type.
  [[nodiscard]] virtual at::Tensor decode(const at::Tensor& encoded, const at::Tensor& maximum) const = 0;
  /// `parameter`'s full encoded elements (its shape) and the maximum they were encoded with, before a forward.
  virtual void gathered(const at::Tensor& parameter, const at::Tensor& encoded, const at::Tensor& maximum) = 0;
  /// `parameter`'s gathered elements are let go (or about to be gathered in full): forget them.
  virtual void released(const at::Tensor& parameter) = 0;

 protected:
  parameter_encoding() = default;
  parameter_encoding(const parameter_encoding&) = default;
  parameter_encoding& operator=(const parameter_encoding&) = default;
};

}  // namespace accel::detail
