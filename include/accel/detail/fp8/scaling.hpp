/// \file
/// How an fp8 recipe scales (what each recipe type declares as its `scaling`): plain C++, so that the recipes are
/// declared where LibTorch has no float8 too.
#pragma once

namespace accel::detail::fp8 {

/// From each tensor's own amax (torchao's tensorwise), per row (torchao's rowwise), or from the amaxes of earlier
/// steps (TransformerEngine's delayed scaling).
enum class scaling { tensorwise, rowwise, delayed };

}  // namespace accel::detail::fp8
