// One process of check_bigmodel_limits.py's jobs (bigmodel.limits.*): trains a stack of shard units under
// fully_sharded<gloo> for 20 SGD steps, the model built whole (`whole`) or by accel::construct_sharded (`sharded`),
// then writes this process's slices of every parameter, raw, to OUT_DIR/MODE-rank<R>.bin (at rest each parameter
// is its slice). `baseline` only starts the job (LibTorch, the process group) and ends: what a process holds before
// any model.
//
// With ACCEL_TEST_CGROUP_PREFIX set, the process first moves itself into the memory cgroup PREFIX<rank> and starts
// again (exec), so that everything it maps and allocates from then on, LibTorch's libraries included, is charged
// to that group.
#include <unistd.h>

#include <accel/accel.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

constexpr int units = 32;
constexpr int width = 512;  // a unit: 512 x 512 + 512 parameters, 1 MiB; the model 32 MiB
constexpr int steps = 20;

struct stack_impl : torch::nn::Module {
  stack_impl() {
    for (int i = 0; i < units; ++i)
      blocks.push_back(
          register_module("block" + std::to_string(i), accel::shard_unit(torch::nn::Linear(width, width))));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = torch::tanh(block(x));
    return x;
  }
  std::vector<accel::shard_unit<torch::nn::Linear>> blocks;
};
TORCH_MODULE_IMPL(stack, stack_impl);

/// Moves this process into its cgroup and starts it again there, once (the variable is cleared for the new image).
void enter_cgroup(char** argv) {
  const char* prefix = std::getenv("ACCEL_TEST_CGROUP_PREFIX");
  if (prefix == nullptr || *prefix == '\0') return;
  const auto rank = accel::read_process_environment().rank;
  const auto procs = std::string(prefix) + std::to_string(rank) + "/cgroup.procs";
  std::ofstream(procs) << getpid() << std::flush;
  unsetenv("ACCEL_TEST_CGROUP_PREFIX");
  execv("/proc/self/exe", argv);
  std::cerr << "bigmodel_limits: could not start again inside " << procs << "\n";
  std::exit(2);
}

/// The process's peak resident set (VmHWM), as /proc/self/status gives it.
std::string peak_resident() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmHWM:")) return line;
  return "VmHWM: unknown";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: bigmodel_limits whole|sharded|baseline OUT_DIR\n";
    return 2;
  }
  enter_cgroup(argv);
  const std::string mode = argv[1];
  const std::filesystem::path out = argv[2];
  accel::count_cpu_memory();
  accel::accelerator<accel::fp32, accel::fully_sharded<accel::gloo>> acc;
  if (mode == "baseline") {
    acc.wait_for_everyone();
    return 0;
  }
  accel::set_seed(17);
  stack net = mode == "sharded" ? accel::construct_sharded(acc, [] { return stack(); }) : stack();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05));
  auto [model, opt] = acc.prepare(net, sgd);
  torch::manual_seed(100 + acc.process_index());
  for (int step = 0; step < steps; ++step) {
    acc.backward(model(torch::randn({8, width})).pow(2).mean());
    opt.step();
    opt.zero_grad();
  }
  std::cout << mode << " process " << acc.process_index() << ": tensor storage peak "
            << accel::memory_stats(c10::Device(c10::kCPU)).peak_allocated << " B, " << peak_resident() << "\n";
  std::ofstream file(out / (mode + "-rank" + std::to_string(acc.process_index()) + ".bin"), std::ios::binary);
  for (const auto& p : net->parameters()) {
    const auto slice = p.detach().contiguous();
    file.write(static_cast<const char*>(slice.data_ptr()), static_cast<std::streamsize>(slice.nbytes()));
  }
  if (acc.is_main_process())
    std::ofstream(out / "model_bytes") << static_cast<std::int64_t>(units) * (width * width + width) * 4;
  return file ? 0 : 1;
}
