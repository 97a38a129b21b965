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

namespace accel::detail {

/// The LibTorch archive `directory/name`, its bytes checked against the manifest before LibTorch parses them; its
/// tensors are read onto `device` when one is given, else onto the devices they were saved from.
inline torch::serialize::InputArchive read_archive(const std::filesystem::path& directory, const std::string& name,
                                                   const std::optional<checkpoint_manifest>& manifest,
                                                   const std::optional<c10::Device>& device = std::nullopt) {
  const auto bytes = read_checkpoint_file(directory, name, manifest);
  torch::serialize::InputArchive archive;
  try {
    if (device)
      archive.load_from(bytes.data(), bytes.size(), *device);
    else
      archive.load_from(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    throw checkpoint_error("accel::load_state: " + (directory / name).string() +
                           " is truncated or corrupt: " + first_line(e.what()));
  }
  return archive;
}

/// Writes `archive` to `directory/name`: serialised in memory first, then written by accel, so that a full disk
/// is a `checkpoint_error` (LibTorch's own file writer aborts the process then).
inline written_file write_archive(torch::serialize::OutputArchive& archive, const std::filesystem::path& directory,
                                  const std::string& name) {
  const auto bytes = serialised(archive);
  return write_atomically<checkpoint_error>(directory / name, [&](auto& out) { out.write(bytes); });
}

/// An optimizer's archive: LibTorch's, plus its groups' learning rates, which LibTorch's `load` does not restore
/// (a scheduler's work).
inline void save_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::OutputArchive& archive) {
  optimizer.save(archive);
  std::vector<double> lrs;
  for (auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  archive.write("accel_learning_rates", c10::IValue(lrs));
}
inline void load_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive) {
  optimizer.load(archive);
  c10::IValue lrs;
  if (!archive.try_read("accel_learning_rates", lrs)) return;
  const auto values = lrs.toDoubleVector();
  auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size() && g < values.size(); ++g) groups[g].options().set_lr(values[g]);
}

/// Moves each state tensor of `optimizer` onto its parameter's device, where PyTorch's `load_state_dict` puts it and
/// LibTorch's `Optimizer::load` does not: it leaves them where the archive was read to, `read_to`. The elementwise
/// optimizers' fields move one by one; another optimizer's state (LBFGS's) is read again from its own archive onto
/// the parameter's device, when that is not `read_to`.
inline void place_state_on_parameters(torch::optim::Optimizer& optimizer, const c10::Device& read_to) {
  auto& states = optimizer.state();
  for (auto& group : optimizer.param_groups())
    for (auto& parameter : group.params()) {
      const auto found = states.find(compat::optimizer_state_key(parameter));
      if (found == states.end()) continue;
      const auto device = parameter.device();
      const bool elementwise = transform_state_tensors(*found->second, [&device](const at::Tensor& tensor) {
        return tensor.device() == device ? tensor : tensor.to(device);
      });
      if (elementwise || device == read_to) continue;
      torch::serialize::OutputArchive out;
      found->second->serialize(out);
      const auto bytes = serialised(out);
      torch::serialize::InputArchive in;
      in.load_from(bytes.data(), bytes.size(), device);
      found->second->serialize(in);
    }
}

/// The full format's model files: the i-th entry of `weights` (what the save_state pre-hooks left) as
/// `checkpoint_files::model(i, safe_serialization)`.
inline void save_models(const std::filesystem::path& dir, const std::vector<safetensors::tensor_list>& weights,
                        checkpoint_manifest& manifest, bool safe_serialization) {
  for (std::size_t i = 0; i < weights.size(); ++i)
    manifest.add(save_tensors(weights[i], dir / checkpoint_files::model(i, safe_serialization), safe_serialization));
}

/// The i-th model's weights in a full checkpoint, from the file its save wrote (safetensors unless only the
/// pickled file is there), checked against the manifest; and that file's name.
inline std::pair<safetensors::tensor_list, std::string> read_model_weights(
    const std::filesystem::path& dir, std::size_t i, const std::optional<checkpoint_manifest>& manifest) {
  const bool pickled = !std::filesystem::exists(dir / checkpoint_files::model(i, true)) &&
                       std::filesystem::exists(dir / checkpoint_files::model(i, false));
  const auto name = checkpoint_files::model(i, !pickled);
  const auto bytes = read_checkpoint_file(dir, name, manifest);
  const auto path = (dir / name).string();
  return {pickled ? unpickle_tensors(bytes, path) : safetensors::parse(bytes, path), name};
}

}  // namespace accel::detail
