// accel-selftest: the LibTorch half of the `accel` tool, built from the installed headers like a user's program.
//   accel-selftest env    LibTorch's facts for `accel env`, one "name: value" line each
//   accel-selftest merge-weights CHECKPOINT OUT [--unsafe_serialization] [--remove_checkpoint_dir]
//                         `accel merge-weights` (which checked the command line): accel::merge_weights
//   accel-selftest test   `accel test`'s checks, in every process of a job under `accel launch`; the main process
//                         reports each check and ends with "accel works on this machine"
#include <accel/accelerator.hpp>
#include <accel/checkpoint.hpp>
#include <accel/detail/support/directory_entries.hpp>
#include <accel/launch.hpp>
#include <torch/cuda.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

using gloo_accelerator = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;

int print_environment() {
  std::printf("%-28s %s\n", "LibTorch:", TORCH_VERSION);
  const bool cuda = torch::cuda::is_available();
  std::printf("%-28s %s\n", "LibTorch CUDA:",
              cuda ? (std::to_string(torch::cuda::device_count()) + " device(s)").c_str()
                   : "no (CPU only: this LibTorch has no CUDA or sees no GPU)");
  std::printf("%-28s %s\n", "Gloo:", "yes (c10d ProcessGroupGloo: data_parallel<gloo>, the CPU collectives)");
  std::printf("%-28s %d intra-op, %d inter-op\n", "LibTorch threads:", at::get_num_threads(),
              static_cast<int>(at::get_num_interop_threads()));
  return 0;
}

/// A failed check: what was being checked and what went wrong.
struct check_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void require(bool condition, const std::string& what) {
  if (!condition) throw check_failed(what);
}

void check_collectives(gloo_accelerator& acc) {
  const int P = acc.num_processes(), r = acc.process_index();
  const auto sum = acc.reduce(torch::full({3}, static_cast<float>(r + 1)));
  require(torch::equal(sum, torch::full({3}, P * (P + 1) / 2.0f)), "all-reduce: the sum over processes is wrong");
  const auto names = acc.gather_object(std::string("process ") + std::to_string(r));
  require(names.size() == static_cast<std::size_t>(P) && names.back() == "process " + std::to_string(P - 1),
          "gather_object: the gathered values are wrong");
  acc.print("ok: all-reduce and gather_object across", P, "processes");
}

torch::nn::Sequential make_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 1));
}

/// P processes x batch B train exactly as one process x batch P*B (DDP's averaged gradients).
void check_training(gloo_accelerator& acc) {
  const int P = acc.num_processes(), r = acc.process_index();
  constexpr int B = 4, steps = 5;
  torch::manual_seed(1);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> global;
  for (int s = 0; s < steps; ++s) global.emplace_back(torch::randn({P * B, 8}), torch::randn({P * B, 1}));

  auto reference = make_model();
  torch::optim::SGD reference_optimizer(reference->parameters(), 0.1);
  for (const auto& [x, y] : global) {
    reference_optimizer.zero_grad();
    torch::nn::functional::mse_loss(reference->forward(x), y).backward();
    reference_optimizer.step();
  }

  auto net = make_model();
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, optimizer);
  for (const auto& [x, y] : global) {
    auto loss = torch::nn::functional::mse_loss(model(x.narrow(0, r * B, B)), y.narrow(0, r * B, B));
    acc.backward(loss);
    opt.step();
    opt.zero_grad();
  }
  double difference = 0;
  const auto mine = net->parameters(), expected = reference->parameters();
  for (std::size_t i = 0; i < mine.size(); ++i)
    difference = std::max(difference, (mine[i] - expected[i]).abs().max().item<double>());
  require(difference < 1e-5, "data-parallel training: " + std::to_string(P) + " processes differ from one process by " +
                                 std::to_string(difference) + " (more than 1e-5)");
  acc.print("ok:", P, "processes x batch", B, "train as 1 process x batch", P * B, "(largest difference", difference,
            "after", steps, "SGD steps)");
}

/// save_state then load_state gives the weights back, in a directory the main process chooses and removes.
void check_checkpoint(gloo_accelerator& acc) {
  auto net = make_model();
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, optimizer);
  const auto directory = std::filesystem::temp_directory_path() /
                         ("accel-selftest-port-" + std::to_string(accel::read_process_environment().master_port));
  const auto saved = net->parameters()[0].clone();
  acc.save_state(directory);
  {
    torch::NoGradGuard no_grad;
    net->parameters()[0].add_(1.0);
  }
  acc.load_state(directory);
  require(torch::equal(net->parameters()[0], saved), "save_state/load_state: the weights did not come back");
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(directory);
  acc.print("ok: save_state and load_state");
}

int run_checks() {
  accel::options opts;
  opts.cpu = true;
  opts.timeout = std::chrono::seconds(60);  // a process that never arrives fails the test instead of hanging it
  gloo_accelerator acc(opts);
  try {
    check_collectives(acc);
    check_training(acc);
    check_checkpoint(acc);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel test: FAILED on process %d: %s\n", acc.process_index(), e.what());
    return 1;
  }
  acc.wait_for_everyone();
  acc.print("accel works on this machine");
  return 0;
}

// `accel merge-weights`' flags, as accel passes them on after the two directories.
std::optional<accel::merge_weights_options> merge_flags(const std::vector<std::string>& flags) {
  accel::merge_weights_options options;
  for (const std::string& flag : flags) {
    if (flag == "--unsafe_serialization")
      options.safe_serialization = false;
    else if (flag == "--remove_checkpoint_dir")
      options.remove_checkpoint_dir = true;
    else
      return std::nullopt;
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const auto merge_options = merge_flags({argv + std::min(argc, 4), argv + argc});
  if (mode == "merge-weights" && argc >= 4 && merge_options) try {
      for (const auto& file : accel::merge_weights(argv[2], argv[3], *merge_options))
        std::printf("wrote %s\n", file.c_str());
      if (merge_options->remove_checkpoint_dir) std::printf("removed %s\n", argv[2]);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "accel merge-weights: error: %s\n", e.what());
      return 1;
    }
  try {
    if (mode == "env") return print_environment();
    if (mode == "test") return run_checks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel test: FAILED: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: accel-selftest env|test|merge-weights CHECKPOINT OUT [FLAGS] (run by 'accel env', 'accel test' "
               "and 'accel merge-weights')\n");
  return 2;
}
