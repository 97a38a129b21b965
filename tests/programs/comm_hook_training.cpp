// For tests/scripts/check_comm_hooks.py: `comm_hook_training WORK_DIR OUT_FILE [SETTING=VALUE ...]`, run on 2 Gloo
// processes under `accel launch`, trains the MLP the script built (WORK_DIR/initial.safetensors) on each process's
// batches (WORK_DIR/data_rank{R}.safetensors: x0, y0, x1, ...) with data_parallel and the communication hook the
// settings ask for, SGD (the script's loss and learning rate), and writes every step's gradients after the hook
// (`step{K}.{name}`) to OUT_FILE with {rank} replaced by the process index. Settings: hook (none fp16 bf16 power_sgd
// batched_power_sgd), wrapper (none fp16 bf16), rank, start, min_compression_rate, error_feedback, warm_start,
// batch_same_shape (0 or 1), seed.
#include "accel_headers.hpp"
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace programs::comm_hook_training {

namespace {

accel::comm_hook hook_named(const std::string& name) {
  const std::map<std::string, accel::comm_hook> hooks{{"none", accel::comm_hook::none},
                                                      {"fp16", accel::comm_hook::fp16},
                                                      {"bf16", accel::comm_hook::bf16},
                                                      {"power_sgd", accel::comm_hook::power_sgd},
                                                      {"batched_power_sgd", accel::comm_hook::batched_power_sgd}};
  return hooks.at(name);
}

accel::comm_wrapper wrapper_named(const std::string& name) {
  const std::map<std::string, accel::comm_wrapper> wrappers{
      {"none", accel::comm_wrapper::none}, {"fp16", accel::comm_wrapper::fp16}, {"bf16", accel::comm_wrapper::bf16}};
  return wrappers.at(name);
}

accel::comm_hook_options parse_settings(const std::vector<std::string>& settings) {
  accel::comm_hook_options options;
  auto& power_sgd = options.power_sgd;
  for (const auto& setting : settings) {
    const auto equals = setting.find('=');
    if (equals == std::string::npos) throw std::invalid_argument("not SETTING=VALUE: " + setting);
    const auto key = setting.substr(0, equals), value = setting.substr(equals + 1);
    if (key == "hook")
      options.hook = hook_named(value);
    else if (key == "wrapper")
      options.wrapper = wrapper_named(value);
    else if (key == "rank")
      power_sgd.matrix_approximation_rank = std::stoi(value);
    else if (key == "start")
      power_sgd.start_power_sgd_iter = std::stoi(value);
    else if (key == "min_compression_rate")
      power_sgd.min_compression_rate = std::stod(value);
    else if (key == "error_feedback")
      power_sgd.use_error_feedback = value == "1";
    else if (key == "warm_start")
      power_sgd.warm_start = value == "1";
    else if (key == "batch_same_shape")
      power_sgd.batch_tensors_with_same_shape = value == "1";
    else if (key == "seed")
      power_sgd.random_seed = std::stoull(value);
    else
      throw std::invalid_argument("unknown setting " + key);
  }
  return options;
}

/// The script's model: torch.nn.Sequential of Linear 32-64, 64-64, 64-32, 32-64, 64-4 with ReLUs (the same names).
torch::nn::Sequential make_model() {
  torch::nn::Sequential net;
  const std::vector<std::pair<int, int>> layers{{32, 64}, {64, 64}, {64, 32}, {32, 64}, {64, 4}};
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (i > 0) net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::Linear(layers[i].first, layers[i].second));
  }
  return net;
}

}  // namespace

int run(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: comm_hook_training WORK_DIR OUT_FILE [SETTING=VALUE ...]\n");
    return 2;
  }
  const std::string work_dir = argv[1];
  std::string out_file = argv[2];
  torch::set_num_threads(1);
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc{
      accel::options{.buckets = {.first_bucket_mb = 1000, .bucket_cap_mb = 1000},
                     .comm_hook = parse_settings(std::vector<std::string>(argv + 3, argv + argc))}};
  auto net = make_model();
  {
    torch::NoGradGuard no_grad;
    const auto initial = accel::safetensors::load(work_dir + "/initial.safetensors");
    const std::map<std::string, torch::Tensor> by_name(initial.begin(), initial.end());
    for (auto& item : net->named_parameters()) item.value().copy_(by_name.at(item.key()));
  }
  torch::optim::SGD optimizer(net->parameters(), 1e-3);
  auto [model, opt] = acc.prepare(net, optimizer);

  const auto rank = std::to_string(acc.process_index());
  const auto data = accel::safetensors::load(work_dir + "/data_rank" + rank + ".safetensors");
  const std::map<std::string, torch::Tensor> batches(data.begin(), data.end());
  accel::safetensors::tensor_list gradients;
  for (int step = 0; batches.count("x" + std::to_string(step)) != 0; ++step) {
    const auto suffix = std::to_string(step);
    acc.backward(torch::mse_loss(model(batches.at("x" + suffix)), batches.at("y" + suffix), torch::Reduction::Sum));
    for (const auto& item : net->named_parameters())
      gradients.emplace_back("step" + suffix + "." + item.key(), item.value().grad().clone());
    opt.step();
    opt.zero_grad();
  }
  out_file.replace(out_file.find("{rank}"), 6, rank);
  accel::safetensors::save(out_file, gradients);
  if (acc.is_main_process()) {
    const auto* reducer = acc.parallel().reducer_for(*net);
    std::printf("comm_hook_training: communicated %llu bytes\n",
                static_cast<unsigned long long>(reducer->communicated_bytes()));
  }
  return 0;
}

}  // namespace programs::comm_hook_training
