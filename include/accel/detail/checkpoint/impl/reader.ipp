/// \file
/// What reader.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../reader.hpp"

namespace accel::detail {

process_files process_files_to_read(std::int64_t saved_processes, int process, int processes) {
  if (saved_processes < 1)
    throw checkpoint_error("accel::load_state: " + std::string(checkpoint_files::accel_state) + " says " +
                           std::to_string(saved_processes) + " processes wrote the checkpoint (a damaged file?)");
  if (saved_processes == processes) return {process, process};
  return {0, process < saved_processes ? std::optional<int>(process) : std::nullopt};
}

void check_generator_states(const std::vector<std::pair<at::Generator, at::Tensor>>& states, const std::string& file) {
  for (const auto& [generator, state] : states) try {
      compat::check_generator_state(generator, state);
    } catch (const std::exception& e) {
      throw checkpoint_error("accel::load_state: " + file + " holds a damaged " + generator.device().str() +
                             " generator state (" + first_line(e.what()) + "); nothing was loaded");
    }
}

checkpoint_reader::checkpoint_reader(const std::filesystem::path& directory, const prepared_registry& registry,
                                     int process, int processes, const c10::Device& read_to, bool allow_unchecked,
                                     held_parts parts)
    : allow_unchecked_(allow_unchecked),
      parts_(std::move(parts)),
      directory_(directory),
      process_(process),
      processes_(processes),
      read_to_(read_to),
      optimizers_(registry.optimizers().size()),
      slots_(registry.slots_by_kind()) {}

checkpoint_contents checkpoint_reader::read(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                                            bool hooked) {
  for (int attempt = 1;; ++attempt) {
    const auto before = identity();
    try {
      return read_once(models, hooked);
    } catch (const checkpoint_error&) {
      if (attempt == max_attempts || identity() == before) throw;
    }
  }
}

std::array<std::uint64_t, 4> checkpoint_reader::identity() const {
  const auto of = [](const std::filesystem::path& path) {
    struct stat status{};
    return ::stat(path.c_str(), &status) == 0 ? std::pair<std::uint64_t, std::uint64_t>(status.st_dev, status.st_ino)
                                              : std::pair<std::uint64_t, std::uint64_t>(0, 0);
  };
  const auto directory = of(directory_), manifest = of(directory_ / checkpoint_files::manifest);
  return {directory.first, directory.second, manifest.first, manifest.second};
}

checkpoint_contents checkpoint_reader::read_once(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                                                 bool hooked) {
  if (!std::filesystem::is_directory(directory_))
    throw checkpoint_error("accel::load_state: no checkpoint at " + directory_.string());
  manifest_ = read_manifest(directory_);
  if (!manifest_ && std::filesystem::exists(directory_ / checkpoint_files::shard_layout))
    throw sharded_without_manifest(directory_);  // before any file of it is parsed
  if (!manifest_ && !allow_unchecked_) throw unchecked_checkpoint(directory_, "accel::load_state");
  const auto files = check_counts(models.size(), hooked);
  checkpoint_contents contents;
  read_weights(models, contents);
  contents.process_file = checkpoint_files::process(files.state);
  contents.process_state = read_archive(directory_, contents.process_file, manifest_);
  for (std::size_t i = 0; i < optimizers_; ++i)
    contents.optimizer_archives.push_back(
        read_archive(directory_, checkpoint_files::optimizer(i), manifest_, read_to_));
  read_slots(contents);
  if (files.generators) read_generators(*files.generators, files.state, contents);
  return contents;
}

process_files checkpoint_reader::check_counts(std::size_t models, bool hooked) {
  auto shared = read_archive(directory_, std::string(checkpoint_files::accel_state), manifest_);
  const auto count = [&](const std::string& key) {
    c10::IValue value;
    if (!shared.try_read(key, value) || !value.isInt())
      throw checkpoint_error("accel::load_state: " + (directory_ / checkpoint_files::accel_state).string() +
                             " lacks \"" + key + "\"");
    return value.toInt();
  };
  const auto expect = [&](const std::string& key, std::size_t mine) {
    if (count(key) != static_cast<std::int64_t>(mine))
      throw checkpoint_error("accel::load_state: the checkpoint in " + directory_.string() + " has " +
                             std::to_string(count(key)) + " " + key + ", this program " + std::to_string(mine) +
                             (key == "models" && hooked ? " after its load_state pre-hooks (which must remove the "
                                                          "models whose weights its save_state pre-hooks removed)"
                                                        : "") +
                             "; prepare the same objects, in the same order, as when saving");
  };
  const auto files = process_files_to_read(count("processes"), process_, processes_);
  expect("models", models);
  expect("optimizers", optimizers_);
  for (const auto& [kind, list] : slots_) expect(kind, list.size());
  for (const auto& key : shared.keys())
    if (key != "processes" && key != "models" && key != "optimizers" && !slots_.contains(key))
      expect(key, 0);  // the checkpoint holds objects of a kind this program did not prepare
  sharded_ = shard_layout_table::load(directory_, manifest_);
  if (sharded_ && (sharded_->processes != count("processes") || sharded_->models.size() != models))
    throw checkpoint_error("accel::load_state: " + (directory_ / checkpoint_files::shard_layout).string() +
                           " does not match " + std::string(checkpoint_files::accel_state) +
                           " (a damaged checkpoint?)");
  return files;
}

void checkpoint_reader::read_weights(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                                     checkpoint_contents& contents) {
  contents.sharded = sharded_.has_value();
  auto& ranged = contents.ranged;
  if (manifest_) ranged.emplace(directory_, *manifest_);
  for (std::size_t i = 0; i < models.size(); ++i) {
    const auto what = [&](const std::string& name) {
      return "accel::load_state: the weights in " + (directory_ / name).string() + " do not fit the prepared model";
    };
    const auto full_name = checkpoint_files::model(i, true);
    if (sharded_ || (ranged && manifest_->files().contains(full_name))) {
      auto held = sharded_
                      ? read_held_shards(*ranged, *sharded_, i, parts_, *models[i],
                                         what(checkpoint_files::shard(checkpoint_files::kind::model, i, 0)))
                      : read_held_files(*ranged, {ranged->open(full_name)}, i, parts_, *models[i], what(full_name));
      contents.weights.emplace_back();
      contents.weight_reads.push_back(std::move(held.reads));
      contents.sliced_weights.push_back(std::move(held.sliced));
      continue;
    }
    auto [loaded, name] = read_model_weights(directory_, i, manifest_);
    contents.weights.emplace_back(loaded.begin(), loaded.end());
    contents.weight_reads.emplace_back();
    check_weights_fit(whole_state_of(*models[i], i, parts_), contents.weights.back(), what(name));
    contents.sliced_weights.push_back(keep_held_slices(contents.weights.back(), i, parts_));
  }
  for (std::size_t i = 0; sharded_ && i < optimizers_; ++i)
    contents.optimizer_states.push_back(read_held_optimizer_state(*ranged, *sharded_, i, parts_));
  if (ranged) ranged->check_whole_files();
  for (auto& states : contents.optimizer_states)
    for (auto& [name, tensor] : states) tensor = tensor.to(read_to_);  // map_location
}

void checkpoint_reader::read_slots(checkpoint_contents& contents) {
  for (const auto& [kind, list] : slots_)
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (list[i]->scope == state_scope::shared) {
        contents.slot_archives[kind].push_back(read_archive(directory_, checkpoint_files::slot(kind, i), manifest_));
        continue;
      }
      contents.slot_archives[kind].emplace_back();
      if (!contents.process_state.try_read(checkpoint_files::slot_key(kind, i), contents.slot_archives[kind].back()))
        throw checkpoint_error("accel::load_state: " + contents.process_file + " lacks " + kind + " " +
                               std::to_string(i) + "'s position (saved by another configuration?)");
    }
}

void checkpoint_reader::read_generators(int from, int state_file, checkpoint_contents& contents) {
  const auto file = checkpoint_files::process(from);
  std::optional<torch::serialize::InputArchive> other;
  auto& archive =
      from == state_file ? contents.process_state : other.emplace(read_archive(directory_, file, manifest_));
  for (auto& [key, generator] : generators()) {
    at::Tensor state;
    if (archive.try_read(key, state))
      contents.generator_states.emplace_back(generator, state);
    else if (key == "cpu_rng")
      throw checkpoint_error("accel::load_state: " + file + " lacks the CPU generator state");
  }
  check_generator_states(contents.generator_states, file);
}

}  // namespace accel::detail
