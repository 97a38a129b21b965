// The small transformer of examples/char_transformer.hpp trained through accel, for tests/scripts/
// check_mixed_precision.py, which runs the same training in PyTorch (torch.autocast + GradScaler) and compares.
//   parity DEVICE PRECISION DIR   50 steps of fp16/bf16/fp32 from DIR/initial.safetensors (the weights) and
//                                 DIR/batches.safetensors (inputs, targets, and the settings as metadata; loaded
//                                 through a data loader with pinned memory, copied without blocking); writes
//                                 DIR/accel.txt: one line a step, "step loss skipped scale"
//   resume DEVICE PART DIR        fp16 with dropout and data drawn from the default generators, for save_state /
//                                 load_state across processes: PART whole (20 steps, weights to DIR/whole), first
//                                 (10 steps, save_state to DIR/checkpoint, the generators' states to
//                                 DIR/states_saved.safetensors), second (another seed, load_state, the states to
//                                 DIR/states_loaded.safetensors and, before the load, DIR/states_before.safetensors;
//                                 10 more steps, weights to DIR/resumed)
// DEVICE is cpu or cuda; cuda without a GPU exits 77 (skipped).
#include "accel_headers.hpp"
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <string>

#include "char_transformer.hpp"

namespace programs::mixed_precision_training {

namespace {

namespace fs = std::filesystem;

/// The settings check_mixed_precision.py wrote into the batches file's metadata, as numbers.
struct metadata {
  std::map<std::string, std::string> values;
  [[nodiscard]] double number(const std::string& key) const {
    auto found = values.find(key);
    if (found == values.end()) throw std::runtime_error("batches.safetensors has no metadata '" + key + "'");
    return std::stod(found->second);
  }
  [[nodiscard]] int64_t integer(const std::string& key) const { return static_cast<int64_t>(number(key)); }
};

/// One window a sample, for an accel::data_loader: the parity run loads its batches through page-locked memory and
/// worker threads, so that on a GPU the loader's non-blocking copies are checked by the same comparison.
struct windows {
  torch::Tensor inputs, targets;  // [samples, context]
  [[nodiscard]] int64_t size() const { return inputs.size(0); }
  [[nodiscard]] torch::data::Example<> get(size_t i) const {
    return {inputs[static_cast<int64_t>(i)], targets[static_cast<int64_t>(i)]};
  }
};

accel::options parity_options(const std::string& device, const metadata& settings) {
  return {.cpu = device == "cpu",
          .grad_scaler = {.init_scale = settings.number("init_scale"),
                          .growth_interval = static_cast<int>(settings.integer("growth_interval"))},
          .non_blocking = true};
}

/// The parity run: the Python side does the same steps with torch.autocast and GradScaler.
template <class Precision>
void train_for_parity(const std::string& device, const fs::path& dir) {
  metadata settings;
  std::map<std::string, torch::Tensor> batches;
  for (auto& [name, tensor] : accel::safetensors::load(dir / "batches.safetensors", &settings.values))
    batches[name] = tensor;
  const auto& inputs = batches.at("inputs");  // [steps, batch, context]
  accel::accelerator<Precision> acc(parity_options(device, settings));
  CharTransformer net(settings.integer("vocabulary"), settings.integer("context"), settings.integer("dim"),
                      settings.integer("heads"), settings.integer("layers"), /*dropout=*/0.0);
  accel::load_model(*net, dir / "initial.safetensors");
  torch::optim::AdamW optimizer(
      net->parameters(),
      torch::optim::AdamWOptions(settings.number("lr")).weight_decay(settings.number("weight_decay")));
  accel::data_loader loader(windows{inputs.flatten(0, 1), batches.at("targets").flatten(0, 1)},
                            {.batch_size = inputs.size(1), .num_workers = 2, .pin_memory = true});
  auto [model, opt, prepared] = acc.prepare(net, optimizer, loader);
  std::ofstream out(dir / "accel.txt");
  out << std::setprecision(std::numeric_limits<double>::max_digits10);  // every bit of the loss
  int64_t step = 0;
  for (auto&& batch : prepared) {
    const auto logits = model(batch.data);
    const auto loss = torch::nn::functional::cross_entropy(logits.flatten(0, 1), batch.target.flatten());
    acc.backward(loss);
    opt.step();
    opt.zero_grad();
    out << step++ << ' ' << loss.template item<double>() << ' ' << acc.optimizer_step_was_skipped() << ' '
        << acc.precision().loss_scale() << '\n';
  }
  std::cout << Precision::name() << " on " << acc.device() << ": " << step << " steps written to "
            << (dir / "accel.txt").string() << "\n";
}

/// Every default generator's state, by the name a checkpoint gives it (the CPU's, each CUDA device's).
accel::safetensors::tensor_list generator_states() {
  accel::safetensors::tensor_list states{{"cpu_rng", at::detail::getDefaultCPUGenerator().get_state()}};
  for (int device = 0; device < static_cast<int>(torch::cuda::device_count()); ++device)
    states.emplace_back("cuda_rng_" + std::to_string(device),
                        at::globalContext()
                            .defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)))
                            .get_state());
  return states;
}

/// The resume check's training: fp16 (loss scale in the checkpoint), dropout on the device (its generator), the
/// batches drawn from the CPU generator (its state), an init scale that overflows at first (skipped steps).
void train_for_resume(const std::string& device, const std::string& part, const fs::path& dir) {
  constexpr int64_t vocabulary = 32, context = 16, batch = 8, total_steps = 20, saved_at = 10;
  accel::set_seed(part == "second" ? 12345 : 0);  // the second part's draws differ until load_state
  accel::accelerator<accel::fp16> acc({.cpu = device == "cpu", .grad_scaler = {.init_scale = 1 << 20}});
  CharTransformer net(vocabulary, context, /*dim=*/32, /*heads=*/4, /*layers=*/1, /*dropout=*/0.1);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  auto [model, opt] = acc.prepare(net, optimizer);
  int64_t step = 0;
  if (part == "second") {
    accel::safetensors::save(dir / "states_before.safetensors", generator_states());
    acc.load_state(dir / "checkpoint");
    accel::safetensors::save(dir / "states_loaded.safetensors", generator_states());
    step = saved_at;
  }
  const int64_t end = part == "first" ? saved_at : total_steps;
  for (; step < end; ++step) {
    const auto tokens = torch::randint(vocabulary, {batch, context + 1}, torch::kLong).to(acc.device());
    const auto logits = model(tokens.narrow(1, 0, context));
    acc.backward(torch::nn::functional::cross_entropy(logits.flatten(0, 1), tokens.narrow(1, 1, context).flatten()));
    opt.step();
    opt.zero_grad();
  }
  if (part == "first") {
    acc.save_state(dir / "checkpoint");
    accel::safetensors::save(dir / "states_saved.safetensors", generator_states());
  } else {
    accel::save_model(*net, dir / (part == "whole" ? "whole" : "resumed"));
  }
  std::cout << "resume " << part << " on " << acc.device() << ": step " << step << ", loss scale "
            << acc.precision().loss_scale() << "\n";
}

int usage() {
  std::cerr << "usage: accel_mixed_precision_training parity cpu|cuda fp16|bf16|fp32 DIR\n"
               "       accel_mixed_precision_training resume cpu|cuda whole|first|second DIR\n";
  return 2;
}

}  // namespace

int run(int argc, char** argv) {
  if (argc != 5) return usage();
  const std::string mode = argv[1], device = argv[2], variant = argv[3];
  const fs::path dir = argv[4];
  if (device != "cpu" && device != "cuda") return usage();
  if (device == "cuda" && !torch::cuda::is_available()) {
    std::cout << "no CUDA device: nothing run\n";
    return 77;
  }
  try {
    if (mode == "parity" && variant == "fp16")
      train_for_parity<accel::fp16>(device, dir);
    else if (mode == "parity" && variant == "bf16")
      train_for_parity<accel::bf16>(device, dir);
    else if (mode == "parity" && variant == "fp32")
      train_for_parity<accel::fp32>(device, dir);
    else if (mode == "resume" && (variant == "whole" || variant == "first" || variant == "second"))
      train_for_resume(device, variant, dir);
    else
      return usage();
  } catch (const std::exception& error) {
    std::cerr << "accel_mixed_precision_training: " << error.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace programs::mixed_precision_training
