/// \file
/// What accelerate_format.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../accelerate_format.hpp"

#include <random>

namespace accel::detail {

bool is_accelerate_checkpoint(const std::filesystem::path& directory) {
  namespace files = checkpoint_files;
  const auto has = [&directory](const std::string& name) { return std::filesystem::exists(directory / name); };
  if (has(std::string(files::accel_state)) || has(std::string(files::manifest))) return false;
  return has(accelerate_random_states(0)) || has(files::model(0, true)) || has(files::model(0, false));
}

std::size_t count_numbered(const std::filesystem::path& directory, std::string_view kind, std::string_view extension) {
  std::size_t n = 0;
  while (std::filesystem::exists(directory / checkpoint_files::numbered(kind, n, extension))) ++n;
  return n;
}

accelerate_reader::accelerate_reader(std::filesystem::path directory, const prepared_registry& registry, int process)
    : directory_(std::move(directory)),
      process_(process),
      optimizers_(registry.optimizers().size()),
      slots_(registry.slots_by_kind()) {}

accelerate_contents accelerate_reader::read(const std::vector<std::shared_ptr<torch::nn::Module>>& models) {
  namespace files = checkpoint_files;
  const auto schedulers = slots_.contains(std::string(files::kind::scheduler))
                              ? slots_.at(std::string(files::kind::scheduler)).size()
                              : std::size_t{0};
  expect("models",
         std::max(count_numbered(directory_, files::kind::model, ".safetensors"),
                  count_numbered(directory_, files::kind::pickled_model, ".bin")),
         models.size());
  expect("optimizers", count_numbered(directory_, files::kind::optimizer, ".bin"), optimizers_);
  expect("schedulers", count_numbered(directory_, files::kind::scheduler, ".bin"), schedulers);
  refuse_unmapped_slots();
  accelerate_contents contents;
  for (std::size_t i = 0; i < models.size(); ++i) {
    auto [weights, name] = read_model(i);
    contents.weights.push_back(std::move(weights));
    check_weights_fit(*models[i], contents.weights.back(),
                      "accel::load_state: the weights in " + (directory_ / name).string() +
                          " do not fit the prepared model (PyTorch's state_dict keys are LibTorch's names)");
  }
  for (std::size_t i = 0; i < optimizers_; ++i) contents.optimizers.push_back(read_pickle(files::optimizer(i)));
  for (std::size_t i = 0; i < schedulers; ++i)
    contents.schedulers.push_back(read_pickle(files::slot(files::kind::scheduler, i)));
  read_generators(contents);
  return contents;
}

void accelerate_reader::expect(const std::string& what, std::size_t saved, std::size_t mine) const {
  if (saved != mine)
    throw checkpoint_error("accel::load_state: the Accelerate checkpoint in " + directory_.string() + " has " +
                           std::to_string(saved) + " " + what + ", this program " + std::to_string(mine) +
                           "; prepare the same objects, in the same order, as the Python program");
}

void accelerate_reader::refuse_unmapped_slots() const {
  for (const auto& [kind, list] : slots_)
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (kind == checkpoint_files::kind::range) continue;  // Accelerate keeps no data positions: they stay
      if (!list[i]->load_python)
        throw checkpoint_error("accel::load_state: " + directory_.string() + " is an Accelerate checkpoint, and " +
                               kind + " " + std::to_string(i) +
                               " of this program has no PyTorch counterpart accel maps it onto (it maps "
                               "torch::optim::StepLR; registered objects are not); docs/python.md");
    }
}

std::pair<std::map<std::string, at::Tensor>, std::string> accelerate_reader::read_model(std::size_t i) const {
  const auto safe = checkpoint_files::model(i, true);
  if (std::filesystem::exists(directory_ / safe)) {
    const auto tensors =
        safetensors::parse(read_checkpoint_file(directory_, safe, std::nullopt), (directory_ / safe).string());
    return {{tensors.begin(), tensors.end()}, safe};
  }
  const auto pickled = checkpoint_files::model(i, false);
  const auto dict = read_pickle(pickled);
  std::map<std::string, at::Tensor> tensors;
  if (dict.isGenericDict())
    for (const auto& item : dict.toGenericDict()) {
      if (!item.key().isString() || !item.value().isTensor())
        throw checkpoint_error((directory_ / pickled).string() + " is not a dict of named tensors");
      tensors.emplace(item.key().toStringRef(), item.value().toTensor());
    }
  return {tensors, pickled};
}

c10::IValue accelerate_reader::read_pickle(const std::string& name) const {
  return read_torch_save(read_checkpoint_file(directory_, name, std::nullopt), (directory_ / name).string());
}

void accelerate_reader::read_generators(accelerate_contents& contents) const {
  const auto name = accelerate_random_states(process_);
  if (!std::filesystem::exists(directory_ / name)) return;
  const auto states = read_pickle(name);
  const auto where = (directory_ / name).string();
  const auto cpu = python_item(states, "torch_manual_seed", where);
  if (!cpu.isTensor()) throw checkpoint_error(where + "'s torch_manual_seed is not a tensor");
  contents.generator_states.emplace_back(generators().front().second, cpu.toTensor());
  check_generator_states(contents.generator_states, name);
  if (process_ == 0 && (python_has(states, "random_state") || python_has(states, "numpy_random_seed")))
    std::cerr << "accel::load_state: " << name << " also holds Python's random and NumPy's generator states; a C++ "
              << "program has neither, so they are not used\n";
}

std::vector<std::int64_t> mersenne_twister_words() {
  std::stringstream text;
  text << std::mt19937();  // the standard's textual form: the 624 state words, then the position
  std::vector<std::int64_t> words(624);
  for (auto& word : words) text >> word;
  return words;
}

c10::IValue accelerate_generator_states() {
  std::vector<c10::IValue> python_words, numpy_words;
  for (const auto word : mersenne_twister_words()) {
    python_words.emplace_back(word);
    numpy_words.emplace_back(word);
  }
  python_words.emplace_back(std::int64_t{624});
  auto states = python_dict();
  states.insert("step", std::int64_t{0});
  states.insert("random_state",
                c10::ivalue::Tuple::create({std::int64_t{3}, c10::ivalue::Tuple::create(python_words), c10::IValue()}));
  states.insert("numpy_random_seed", c10::ivalue::Tuple::create({"MT19937", c10::ivalue::Tuple::create(numpy_words),
                                                                 std::int64_t{624}, std::int64_t{0}, 0.0}));
  auto cpu = generators().front().second;
  std::lock_guard<std::mutex> lock(cpu.mutex());
  states.insert("torch_manual_seed", cpu.get_state());
  return c10::IValue(states);
}

void write_torch_save(const c10::IValue& value, const std::filesystem::path& directory, const std::string& name) {
  const auto bytes = torch_save_bytes(value);
  write_atomically<checkpoint_error>(directory / name, [&](auto& out) { out.write(bytes.data(), bytes.size()); });
}

void write_accelerate_checkpoint(const std::filesystem::path& directory, const prepared_registry& registry,
                                 const std::vector<std::shared_ptr<torch::nn::Module>>& models, int process,
                                 bool safe_serialization) {
  namespace files = checkpoint_files;
  std::vector<c10::IValue> optimizers, schedulers;
  for (std::size_t i = 0; i < registry.optimizers().size(); ++i)
    optimizers.push_back(
        python_optimizer_state(*registry.optimizers()[i], "accel::save_state (" + files::optimizer(i) + ")"));
  for (const auto& [kind, list] : registry.slots_by_kind())
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (kind == files::kind::range) continue;  // Accelerate's load_state reads no data positions
      if (!list[i]->save_python)
        throw checkpoint_error("accel::save_state: " + kind + " " + std::to_string(i) +
                               " has no PyTorch counterpart accel maps it onto (it maps torch::optim::StepLR; "
                               "registered objects are not), so Accelerate could not load it; docs/python.md");
      schedulers.push_back(list[i]->save_python());
    }
  std::filesystem::create_directories(directory);
  if (process == 0) {
    for (std::size_t i = 0; i < models.size(); ++i) {
      if (safe_serialization) {
        safetensors::save(directory / files::model(i, true), state_of(*models[i]));
        continue;
      }
      auto tensors = python_dict();  // a plain dict of tensors, which torch.load(weights_only=True) reads
      for (const auto& [name, tensor] : state_of(*models[i])) tensors.insert(name, tensor);
      write_torch_save(c10::IValue(tensors), directory, files::model(i, false));
    }
    for (std::size_t i = 0; i < optimizers.size(); ++i) write_torch_save(optimizers[i], directory, files::optimizer(i));
    for (std::size_t i = 0; i < schedulers.size(); ++i)
      write_torch_save(schedulers[i], directory, files::slot(files::kind::scheduler, i));
  }
  write_torch_save(accelerate_generator_states(), directory, accelerate_random_states(process));
}

}  // namespace accel::detail
