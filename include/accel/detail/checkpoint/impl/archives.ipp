/// \file
/// What archives.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../archives.hpp"

namespace accel::detail {

torch::serialize::InputArchive read_archive(const std::filesystem::path& directory, const std::string& name,
                                            const std::optional<checkpoint_manifest>& manifest,
                                            const std::optional<c10::Device>& device) {
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

written_file write_archive(torch::serialize::OutputArchive& archive, const std::filesystem::path& directory,
                           const std::string& name) {
  return write_atomically<checkpoint_error>(directory / name, [&](auto& out) {
    // Streamed into the file as LibTorch's zip writer makes it: no copy of the whole archive in memory. A failed
    // write is kept and raised once the writer is done, never reported to it: LibTorch's writer, told of a failure,
    // throws, and its destructor then throws again (std::terminate).
    std::exception_ptr failure;
    archive.save_to([&](const void* data, std::size_t bytes) -> std::size_t {
      if (!failure) try {
          out.write(data, bytes);
        } catch (...) {
          failure = std::current_exception();
        }
      return bytes;
    });
    if (failure) std::rethrow_exception(failure);
  });
}

void save_models(const std::filesystem::path& dir, const std::vector<safetensors::tensor_list>& weights,
                 checkpoint_manifest& manifest, bool safe_serialization) {
  for (std::size_t i = 0; i < weights.size(); ++i)
    manifest.add(save_tensors(weights[i], dir / checkpoint_files::model(i, safe_serialization), safe_serialization));
}

std::pair<safetensors::tensor_list, std::string> read_model_weights(
    const std::filesystem::path& dir, std::size_t i, const std::optional<checkpoint_manifest>& manifest) {
  const bool pickled = !std::filesystem::exists(dir / checkpoint_files::model(i, true)) &&
                       std::filesystem::exists(dir / checkpoint_files::model(i, false));
  const auto name = checkpoint_files::model(i, !pickled);
  const auto bytes = read_checkpoint_file(dir, name, manifest);
  const auto path = (dir / name).string();
  return {pickled ? unpickle_tensors(bytes, path) : safetensors::parse(bytes, path), name};
}

}  // namespace accel::detail
