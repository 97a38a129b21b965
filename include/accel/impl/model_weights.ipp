/// \file
/// What model_weights.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../model_weights.hpp"

#include "../detail/support/pickle_functions.hpp"

namespace accel::detail {

safetensors::tensor_list state_of(const torch::nn::Module& module) {
  safetensors::tensor_list state;
  for (const auto& item : module.named_parameters()) state.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers()) state.emplace_back(item.key(), item.value());
  return state;
}

void check_weights_fit(const safetensors::tensor_list& state, const std::map<std::string, at::Tensor>& weights,
                       const std::string& what) {
  std::string problems;
  for (const auto& [name, tensor] : state) {
    auto found = weights.find(name);
    if (found == weights.end()) {
      problems += "\n  missing: " + name;
    } else if (found->second.sizes() != tensor.sizes() || found->second.scalar_type() != tensor.scalar_type()) {
      std::ostringstream mismatch;
      mismatch << "\n  " << name << ": the file has " << found->second.scalar_type() << found->second.sizes()
               << ", the model " << tensor.scalar_type() << tensor.sizes();
      problems += mismatch.str();
    }
  }
  for (const auto& [name, tensor] : weights)
    if (std::none_of(state.begin(), state.end(), [&](const auto& s) { return s.first == name; }))
      problems += "\n  unexpected: " + name;
  if (!problems.empty()) throw checkpoint_error(what + "; nothing was loaded:" + problems);
}

void copy_weights(torch::nn::Module& module, const std::map<std::string, at::Tensor>& weights) {
  at::NoGradGuard no_grad;
  for (auto& [name, tensor] : state_of(module)) tensor.copy_(weights.at(name));
}

std::string shard_name(std::size_t index, std::size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

written_file save_tensors(const safetensors::tensor_list& tensors, const std::filesystem::path& path,
                          bool safe_serialization) {
  if (safe_serialization) return safetensors::save(path, tensors);
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor.detach().to(at::kCPU));
  const auto bytes = torch::jit::pickle_save(c10::IValue(dict));
  return write_atomically<checkpoint_error>(path, [&](auto& out) { out.write(bytes.data(), bytes.size()); });
}

safetensors::tensor_list unpickle_tensors(const std::string& bytes, const std::string& file) {
  const auto refuse = [&file](const std::string& why) {
    return checkpoint_error(file + " is not a pickled dict of named tensors (" + why + ")");
  };
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    throw refuse(first_line(e.what()));
  }
  if (!value.isGenericDict()) throw refuse("it holds a " + value.tagKind());
  safetensors::tensor_list tensors;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) throw refuse("an entry is not a string and a tensor");
    tensors.emplace_back(entry.key().toStringRef(), entry.value().toTensor());
  }
  return tensors;
}
}  // namespace accel::detail

namespace accel {

void save_model(const torch::nn::Module& module, const std::filesystem::path& directory, std::int64_t max_shard_bytes) {
  std::filesystem::create_directories(directory);
  for (const auto& file : detail::directory_entries(directory)) {
    const auto name = file.path().filename().string();
    if (name.rfind("model", 0) == 0 && (name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json")))
      std::filesystem::remove(file.path());
  }
  std::vector<safetensors::tensor_list> shards(1);
  std::int64_t shard_bytes = 0, total = 0;
  for (auto& [name, tensor] : detail::state_of(module)) {
    const auto bytes = static_cast<std::int64_t>(tensor.nbytes());
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(name, tensor);
    shard_bytes += bytes;
    total += bytes;
  }
  if (shards.size() == 1) return void(safetensors::save(directory / "model.safetensors", shards.front()));
  std::ostringstream index;
  index << "{\"metadata\": {\"total_size\": " << total << "}, \"weight_map\": {";
  const char* separator = "";
  for (std::size_t i = 0; i < shards.size(); ++i) {
    safetensors::save(directory / detail::shard_name(i, shards.size()), shards[i]);
    for (const auto& [name, tensor] : shards[i]) {
      index << separator << detail::json_string(name) << ": \"" << detail::shard_name(i, shards.size()) << "\"";
      separator = ", ";
    }
  }
  index << "}}\n";
  detail::write_atomically<checkpoint_error>(directory / "model.safetensors.index.json",
                                             [&](auto& out) { out.write(index.str()); });
}

void load_model(torch::nn::Module& module, const std::filesystem::path& where) {
  safetensors::tensor_list loaded;
  if (std::filesystem::is_directory(where)) {
    const auto index = where / "model.safetensors.index.json";
    if (std::filesystem::exists(index)) {
      std::set<std::string> files;
      for (const auto& [name, file] : safetensors::detail::read_weight_map(index)) files.insert(file);
      for (const auto& file : files)
        for (auto& entry : safetensors::load(where / file)) loaded.push_back(std::move(entry));
    } else {
      loaded = safetensors::load(where / "model.safetensors");
    }
  } else {
    loaded = safetensors::load(where);
  }
  const std::map<std::string, at::Tensor> by_name(loaded.begin(), loaded.end());
  detail::check_weights_fit(module, by_name, "accel: the weights in " + where.string() + " do not fit this model");
  detail::copy_weights(module, by_name);
}

}  // namespace accel
