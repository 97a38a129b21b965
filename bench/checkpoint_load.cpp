// One accel job of the checkpoint-load benchmark (bench/load_compare.py runs it under `accel launch --nproc_per_node
// 4`): a model of LAYERS Linear(WIDTH, WIDTH) layers (float32; 16 x 4096 gives 1.07 GB) under fully_sharded with SGD,
// saved to DIR in the given format (untimed), then loaded back into the same prepared model (timed): accel_sharded
// and accel_full by load_state, accel_before_33 (the full format) as accel loaded before issue 33. Process 0 prints
//   `job load_seconds peak_bytes resident_before_bytes checkpoint_bytes`
// where load_seconds is the slowest process's time in load_state, and peak_bytes the largest resident set any process
// reached during the load (/proc/self/status VmHWM, reset just before the load by writing 5 to /proc/self/clear_refs),
// resident_before_bytes the largest resident set just before it.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace {

/// A field of /proc/self/status in bytes (its kB figure).
std::int64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return -1;
}

void reset_peak_resident() { std::ofstream("/proc/self/clear_refs") << "5"; }

std::int64_t directory_bytes(const std::filesystem::path& dir) {
  std::int64_t bytes = 0;
  for (const auto& entry : accel::detail::directory_entries(dir))
    if (entry.is_regular_file()) bytes += static_cast<std::int64_t>(std::filesystem::file_size(entry.path()));
  return bytes;
}

torch::nn::Sequential layers(int count, int width) {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < count; ++i) net->push_back(accel::shard_unit(torch::nn::Linear(width, width)));
  return net;
}

template <class Accelerator>
double slowest(Accelerator& acc, double value) {
  auto t = torch::tensor({value}, torch::kDouble);
  return acc.reduce(t, accel::reduction::max).template item<double>();
}

/// accel's load before issue 33, for comparison (that code is gone): every process reads the whole
/// model.safetensors into memory, then keeps its slice of each parameter (the sharded policies' split:
/// detail::shard_span_of).
template <class Accelerator>
void load_whole_then_slice(Accelerator& acc, torch::nn::Module& model, const std::filesystem::path& dir) {
  const auto whole = accel::safetensors::load(dir / "model.safetensors");
  std::map<std::string, at::Tensor> by_name(whole.begin(), whole.end());
  torch::NoGradGuard no_grad;
  for (const auto& parameter : model.named_parameters()) {
    const auto& slice = parameter.value();
    const auto flat = by_name.at(parameter.key()).reshape(-1);
    const auto span = accel::detail::shard_span_of(flat.numel(), acc.process_index(), acc.num_processes());
    slice.view(-1).copy_(flat.narrow(0, span.begin, span.length));
  }
}

int run(const std::string& job, const std::filesystem::path& dir, int count, int width) {
  const auto format = job == "accel_sharded" ? accel::state_dict_type::sharded : accel::state_dict_type::full;
  accel::accelerator<accel::fp32, accel::fully_sharded<accel::gloo>> acc(
      accel::options{.sharding = {.state_dict = format}});
  auto net = layers(count, width);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(1e-3));
  auto [model, opt] = acc.prepare(net, sgd);
  acc.save_state(dir);
  acc.wait_for_everyone();
  const double before = slowest(acc, static_cast<double>(status_bytes("VmRSS")));
  reset_peak_resident();
  const auto start = std::chrono::steady_clock::now();
  if (job == "accel_before_33")
    load_whole_then_slice(acc, *net, dir);  // net's parameters are the prepared slices
  else
    acc.load_state(dir);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double load_seconds = slowest(acc, seconds);
  const double peak = slowest(acc, static_cast<double>(status_bytes("VmHWM")));
  if (acc.is_main_process())
    std::printf("%s %.4f %.0f %.0f %lld\n", job.c_str(), load_seconds, peak, before,
                static_cast<long long>(directory_bytes(dir)));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string job = argc == 5 ? argv[1] : "";
  if (job != "accel_sharded" && job != "accel_full" && job != "accel_before_33") {
    std::fprintf(stderr, "usage: %s accel_sharded|accel_full|accel_before_33 DIR LAYERS WIDTH\n", argv[0]);
    return 2;
  }
  torch::set_num_threads(1);
  return run(job, argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
}
