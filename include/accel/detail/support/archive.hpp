/// \file
/// LibTorch archives as bytes, and the customisation point of user types that write themselves into one: shared by
/// checkpoints (detail/checkpoint/) and by the objects that travel between processes (detail/comm/ivalue_form.hpp).
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>
#include <string>
#include <utility>

#include "../config.hpp"

namespace accel::detail {

/// `archive`'s bytes, serialised in memory (for a file accel writes itself, or a message between processes).
ACCEL_DECL std::string serialised(torch::serialize::OutputArchive& archive);

/// The customisation point of user types: `save(torch::serialize::OutputArchive&) const` and
/// `load(torch::serialize::InputArchive&)` members (checkpoints, and the object collectives).
template <class T>
concept archive_serialisable =
    requires(const T& t, T& u, torch::serialize::OutputArchive& out, torch::serialize::InputArchive& in) {
      t.save(out);
      u.load(in);
    };

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/archive.ipp"
#endif
