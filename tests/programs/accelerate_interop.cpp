// For tests/scripts/checkpoint_accelerate.cmake (docs/python.md): training state crossing between Accelerate 1.15
// and accel. The run is the one tests/scripts/checkpoint_accelerate.py makes in Python: a Sequential(Linear(4, 16),
// Tanh, Linear(16, 2)), AdamW with weight decay, StepLR, batch s of DIR/data.safetensors plus noise from the CPU
// generator (so its state must cross too), a mean squared error.
//   accelerate_interop continue DIR FIRST M CHECKPOINT  loads DIR/CHECKPOINT (Accelerate's save_state), trains
//                                           batches FIRST..FIRST+M-1, writes DIR/accel_continued_CHECKPOINT.safetensors
//   accelerate_interop train DIR N M          trains N batches, saves DIR/accel_checkpoint in Accelerate's file set
//                                           (and DIR/accel_checkpoint_bin with pytorch_model.bin), trains M more,
//                                           writes DIR/accel_after.safetensors
//   accelerate_interop sharded DIR N         under `accel launch` (2 processes, zero2, the sharded format): trains N
//                                           batches, saves DIR/sharded, and writes the model's outputs for batch 0
//                                           to DIR/accel_outputs.safetensors (for accel merge-weights' output)
#include "accel_headers.hpp"
#include <torch/torch.h>

#include "support.hpp"

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>

namespace programs::accelerate_interop {

namespace {

torch::nn::Sequential interop_model() {
  return torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::Tanh(), torch::nn::Linear(16, 2));
}

/// The model, optimizer and scheduler as the Python script makes them, prepared.
struct interop_run {
  accel::accelerator<> acc{{.cpu = true}};
  torch::nn::Sequential net = interop_model();
  torch::optim::AdamW adamw{net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1)};
  torch::optim::StepLR step_lr{adamw, /*step_size=*/3, /*gamma=*/0.5};
  std::map<std::string, torch::Tensor> data;
  decltype(std::declval<accel::accelerator<>&>().prepare(net, adamw, step_lr)) prepared =
      acc.prepare(net, adamw, step_lr);

  explicit interop_run(const std::filesystem::path& dir) {
    for (auto& [name, tensor] : accel::safetensors::load(dir / "data.safetensors")) data[name] = tensor;
  }

  void train(int first, int steps) {
    auto& [model, opt, sched] = prepared;
    for (int s = first; s < first + steps; ++s) {
      const auto noise = torch::randn({8, 4}) * 0.01;  // the CPU generator's draws, as Python's
      const auto loss = torch::mse_loss(model(data["x"][s] + noise), data["y"][s]);
      acc.backward(loss);
      opt.step();
      sched.step();
      opt.zero_grad();
    }
  }

  /// The parameters, the learning rate, the optimizer's step count and the scheduler's, for the script to compare.
  void write(const std::filesystem::path& file) {
    accel::safetensors::tensor_list out;
    for (const auto& item : net->named_parameters()) out.emplace_back(item.key(), item.value().detach().clone());
    out.emplace_back("lr", torch::tensor({adamw.param_groups()[0].options().get_lr()}, torch::kFloat64));
    const auto& state = static_cast<torch::optim::AdamWParamState&>(
        *adamw.state().at(accel::detail::compat::optimizer_state_key(net->parameters()[0])));
    out.emplace_back("optimizer_step", torch::tensor({state.step()}, torch::kInt64));
    out.emplace_back("scheduler_step_count",
                     torch::tensor({static_cast<std::int64_t>(accel::detail::lr_scheduler_access::step_count(
                                       static_cast<const torch::optim::LRScheduler&>(step_lr)))},
                                   torch::kInt64));
    accel::safetensors::save(file, out);
  }
};

/// The sharded checkpoint of the same model and optimizer, trained under zero2 by every process.
void save_sharded(const std::filesystem::path& dir, int steps) {
  using accelerator = accel::accelerator<accel::fp32, accel::zero2<accel::gloo>>;
  accelerator acc({.sharding = {.state_dict = accel::state_dict_type::sharded}});
  torch::manual_seed(9);
  auto net = interop_model();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  auto [model, opt] = acc.prepare(net, adamw);
  std::map<std::string, torch::Tensor> data;
  for (auto& [name, tensor] : accel::safetensors::load(dir / "data.safetensors")) data[name] = tensor;
  for (int s = 0; s < steps; ++s) {
    acc.backward(torch::mse_loss(model(data["x"][s]), data["y"][s]));
    opt.step();
    opt.zero_grad();
  }
  acc.save_state(dir / "sharded");
  torch::NoGradGuard no_grad;
  if (acc.is_main_process())
    accel::safetensors::save(dir / "accel_outputs.safetensors", {{"y", net->forward(data["x"][0])}});
}

}  // namespace

int run(int argc, char** argv) try {
  const std::string mode = argc > 2 ? argv[1] : "";
  const std::filesystem::path dir = argc > 2 ? argv[2] : "";
  if (mode == "continue" && argc == 6) {
    interop_run run(dir);
    run.acc.load_state(dir / argv[5]);
    run.train(std::stoi(argv[3]), std::stoi(argv[4]));
    run.write(dir / ("accel_continued_" + std::string(argv[5]) + ".safetensors"));
    return 0;
  }
  if (mode == "train" && argc == 5) {
    torch::manual_seed(5);
    interop_run run(dir);
    run.train(0, std::stoi(argv[3]));
    run.acc.save_state(dir / "accel_checkpoint", {.files = accel::file_set::accelerate});
    run.acc.save_state(dir / "accel_checkpoint_bin",
                       {.safe_serialization = false, .files = accel::file_set::accelerate});
    run.train(std::stoi(argv[3]), std::stoi(argv[4]));
    run.write(dir / "accel_after.safetensors");
    return 0;
  }
  if (mode == "sharded" && argc == 4) {
    save_sharded(dir, std::stoi(argv[3]));
    return 0;
  }
  std::cerr << "usage: accelerate_interop continue DIR FIRST M CHECKPOINT | train DIR N M | sharded DIR N\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "accelerate_interop: " << e.what() << '\n';
  return 1;
}

}  // namespace programs::accelerate_interop
