// One process of check_bigmodel_limits.py's jobs (bigmodel.limits.*): trains a stack of shard units under
// fully_sharded<gloo> for 20 SGD steps, the model built whole (`whole`) or by accel::construct_sharded (`sharded`,
// which then saves the sharded-format checkpoint OUT_DIR/checkpoint), then writes this process's slices of every
// parameter, raw, to OUT_DIR/MODE-rank<R>.bin (at rest each parameter is its slice). `load` builds the model by
// construct_sharded, prepares it and loads OUT_DIR/checkpoint (under any number of processes), and writes the
// bytes and CRC-32 of its slices to OUT_DIR/load-P<N>-rank<R>.crc. `baseline` only starts the job (LibTorch, the
// process group, the flight recorder's ring filled) and ends: what a process holds before any model. `whole` also
// writes OUT_DIR/parameters (each parameter's name and elements, in order); `sharded` and `load` write
// OUT_DIR/MODE-P<N>-estimate-rank<R>: accel::estimate_training_bytes' peak for the job and the peak of tensor storage
// counted (accel::count_cpu_memory).
//
// With ACCEL_TEST_CGROUP_PREFIX set, the process first moves itself into the memory cgroup PREFIX<rank> and starts
// again (exec), so that everything it maps and allocates from then on, LibTorch's libraries included, is charged
// to that group.
#include <unistd.h>

#include "accel_headers.hpp"
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace programs::bigmodel_limits {

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
  execv("/proc/self/exe", argv);  // argv[0] unchanged: it picks this program in accel_test_programs
  std::cerr << "bigmodel_limits: could not start again inside " << procs << "\n";
  std::exit(2);
}

/// accel::estimate_training_bytes for this process, each unit's parameters marked as its (the model has full shapes
/// until prepare, built whole or by construct_sharded).
accel::training_bytes estimate(stack& net, const accel::process_environment& env) {
  std::vector<accel::tensor_extent> tensors;
  for (int unit = 0; unit < units; ++unit)
    for (const auto& p : net->blocks[static_cast<std::size_t>(unit)]->parameters())
      tensors.push_back({.elements = p.numel(), .element_size = p.element_size(), .shard_unit = unit});
  return accel::estimate_training_bytes(tensors, {.stage = accel::sharding_stage::fully_sharded,
                                                  .processes = env.world_size,
                                                  .process_index = env.rank,
                                                  .state_tensors = accel::optimizer_state_tensors("sgd")});
}

/// The process's peak resident set (VmHWM), as /proc/self/status gives it.
std::string peak_resident() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmHWM:")) return line;
  return "VmHWM: unknown";
}

using limited_accelerator = accel::accelerator<accel::fp32, accel::fully_sharded<accel::gloo>>;

/// Writes this process's slice of every parameter of `net`, raw and in order, to `file`.
bool write_slices(stack& net, const std::filesystem::path& file) {
  std::ofstream out(file, std::ios::binary);
  for (const auto& p : net->parameters()) {
    const auto slice = p.detach().contiguous();
    out.write(static_cast<const char*>(slice.data_ptr()), static_cast<std::streamsize>(slice.nbytes()));
  }
  return static_cast<bool>(out);
}

/// zlib's CRC-32 (Python's zlib.crc32) of `size` bytes, continuing from `crc`.
std::uint32_t crc32(std::uint32_t crc, const unsigned char* bytes, std::size_t size) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> entries{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      auto c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      entries[i] = c;
    }
    return entries;
  }();
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

/// Writes "BYTES CRC" of this process's slices of every parameter of `net`, in order, to `file`: a loading process
/// writes no copy of them, whose page cache its memory group would be charged for (as much as its slices).
bool write_slices_digest(stack& net, const std::filesystem::path& file) {
  std::uint32_t crc = 0;
  std::int64_t bytes = 0;
  for (const auto& p : net->parameters()) {
    const auto slice = p.detach().contiguous();
    crc = crc32(crc, static_cast<const unsigned char*>(slice.data_ptr()), slice.nbytes());
    bytes += static_cast<std::int64_t>(slice.nbytes());
  }
  std::ofstream out(file);
  out << bytes << " " << crc << "\n";
  return static_cast<bool>(out);
}

/// The estimate's peak for the job (`peak`: step_peak or loading) beside the larger of construction, and the tensor
/// storage counted, as "ESTIMATE COUNTED" in OUT_DIR/NAME-estimate-rank<R>.
void write_estimate(const std::filesystem::path& file, std::int64_t job_peak, const accel::training_bytes& bytes) {
  const auto counted = accel::memory_stats(c10::Device(c10::kCPU)).peak_allocated;
  std::ofstream(file) << std::max(job_peak, bytes.construction) << " " << counted << "\n";
}

/// `whole` and `sharded`: 20 steps of plain SGD; `sharded` then saves the sharded-format checkpoint.
int train(limited_accelerator& acc, const std::string& mode, const std::filesystem::path& out) {
  const auto env = accel::read_process_environment();
  accel::set_seed(17);
  stack net = mode == "sharded" ? accel::construct_sharded(acc, [] { return stack(); }) : stack();
  const auto bytes = estimate(net, env);
  if (mode == "whole" && acc.is_main_process()) {
    std::ofstream names(out / "parameters");
    for (const auto& p : net->named_parameters()) names << p.key() << " " << p.value().numel() << "\n";
  }
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05));
  auto [model, opt] = acc.prepare(net, sgd);
  torch::manual_seed(100 + acc.process_index());
  for (int step = 0; step < steps; ++step) {
    acc.backward(model(torch::randn({8, width})).pow(2).mean());
    opt.step();
    opt.zero_grad();
  }
  if (mode == "sharded") {
    acc.save_state(out / "checkpoint");
    write_estimate(out / ("sharded-P" + std::to_string(env.world_size) + "-estimate-rank" + std::to_string(env.rank)),
                   bytes.step_peak(), bytes);
  }
  std::cout << mode << " process " << acc.process_index() << ": tensor storage peak "
            << accel::memory_stats(c10::Device(c10::kCPU)).peak_allocated << " B, " << peak_resident() << "\n";
  if (acc.is_main_process())
    std::ofstream(out / "model_bytes") << static_cast<std::int64_t>(units) * (width * width + width) * 4;
  return write_slices(net, out / (mode + "-rank" + std::to_string(acc.process_index()) + ".bin")) ? 0 : 1;
}

/// `load`: the model built by construct_sharded and prepared, then the sharded checkpoint loaded into it.
int load(limited_accelerator& acc, const std::filesystem::path& out) {
  const auto env = accel::read_process_environment();
  accel::set_seed(17);
  stack net = accel::construct_sharded(acc, [] { return stack(); });
  const auto bytes = estimate(net, env);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05));
  auto [model, opt] = acc.prepare(net, sgd);
  acc.load_state(out / "checkpoint");
  const auto name = "load-P" + std::to_string(env.world_size);
  write_estimate(out / (name + "-estimate-rank" + std::to_string(env.rank)), bytes.loading(), bytes);
  std::cout << name << " process " << env.rank << ": tensor storage peak "
            << accel::memory_stats(c10::Device(c10::kCPU)).peak_allocated << " B, " << peak_resident() << "\n";
  return write_slices_digest(net, out / (name + "-rank" + std::to_string(env.rank) + ".crc")) ? 0 : 1;
}

}  // namespace

int run(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: bigmodel_limits whole|sharded|load|baseline OUT_DIR\n";
    return 2;
  }
  enter_cgroup(argv);
  const std::string mode = argv[1];
  const std::filesystem::path out = argv[2];
  accel::count_cpu_memory();
  limited_accelerator acc({.sharding = {.state_dict = accel::state_dict_type::sharded}});
  if (mode == "baseline") {
    // The flight recorder's ring full, as in any job that has run a while: its entries are part of every process's
    // own memory, not the model's.
    const auto one = torch::zeros({1});
    for (std::size_t i = 0; i <= accel::detail::flight_recorder::process().capacity(); ++i) (void)acc.reduce(one);
    acc.wait_for_everyone();
    return 0;
  }
  return mode == "load" ? load(acc, out) : train(acc, mode, out);
}

}  // namespace programs::bigmodel_limits
