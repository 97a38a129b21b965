/// \file
/// A checkpoint's files as LibTorch archives and tensors: read (checked against the manifest before anything parses
/// them) and written (serialised in memory, then written atomically); an optimizer's archive with its learning
/// rates; a full checkpoint's model files.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstddef>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "../../model_weights.hpp"
#include "../../safetensors.hpp"
#include "../compat.hpp"
#include "../support/archive.hpp"
#include "../support/atomic_file.hpp"
#include "../support/optimizer_state.hpp"
#include "../support/text.hpp"
#include "format.hpp"
#include "manifest.hpp"
#include "optimizer_archive.hpp"

namespace accel::detail {

/// The LibTorch archive `directory/name`, its bytes checked against the manifest before LibTorch parses them; its
/// tensors are read onto `device` when one is given, else onto the devices they were saved from.
ACCEL_DECL torch::serialize::InputArchive read_archive(const std::filesystem::path& directory, const std::string& name,
                                                       const std::optional<checkpoint_manifest>& manifest,
                                                       const std::optional<c10::Device>& device = std::nullopt);

/// Writes `archive` to `directory/name`: serialised in memory first, then written by accel, so that a full disk
/// is a `checkpoint_error` (LibTorch's own file writer aborts the process then).
ACCEL_DECL written_file write_archive(torch::serialize::OutputArchive& archive, const std::filesystem::path& directory,
                                      const std::string& name);

/// The full format's model files: the i-th entry of `weights` (what the save_state pre-hooks left) as
/// `checkpoint_files::model(i, safe_serialization)`.
ACCEL_DECL void save_models(const std::filesystem::path& dir, const std::vector<safetensors::tensor_list>& weights,
                            checkpoint_manifest& manifest, bool safe_serialization);

/// The i-th model's weights in a full checkpoint, from the file its save wrote (safetensors unless only the
/// pickled file is there), checked against the manifest; and that file's name.
ACCEL_DECL std::pair<safetensors::tensor_list, std::string> read_model_weights(
    const std::filesystem::path& dir, std::size_t i, const std::optional<checkpoint_manifest>& manifest);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/archives.ipp"
#endif
