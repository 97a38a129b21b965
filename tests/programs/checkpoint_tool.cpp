// For tests/scripts/checkpoint_interop.cmake: `checkpoint_tool write FILE` writes known tensors for Python to check;
// `checkpoint_tool check DIR` loads the state dict Python wrote there and saves it back (exit code 0 when it matches).
// For crash_during_save.cmake, concurrent_saves.cmake and synced_save.cmake: `save-loop DIR`, `save-as DIR ID`,
// `save DIR`, `verify DIR`. For sharded_crash_during_save.cmake, under `accel launch` (zero2, AdamW):
// `sharded-save-loop DIR`, `sharded-verify DIR`.
#include "accel_headers.hpp"
#include <torch/torch.h>
#include <unistd.h>

#include "support.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace programs::checkpoint_tool {

namespace {
/// A value in a file of its own (custom_checkpoint.bin), beside the model's: a checkpoint mixed from two saves
/// shows as a value that differs from the bias.
struct tag {
  double value = -1;
  void save(torch::serialize::OutputArchive& archive) const { archive.write("value", c10::IValue(value)); }
  void load(torch::serialize::InputArchive& archive) {
    c10::IValue read;
    archive.read("value", read);
    value = read.toDouble();
  }
};

/// A model large enough (~40 MB) that saving it takes a while: the crash test kills the saver mid-write, and two
/// savers into one directory overlap.
struct saver {
  accel::accelerator<> acc{{.cpu = true}};
  torch::nn::Linear net{2000, 5000};
  accel::prepared_model<torch::nn::Linear, accel::accelerator<>> model = acc.prepare(net);
  tag written;
  saver() { acc.register_for_checkpointing(written); }
  void set(double value) {
    torch::NoGradGuard no_grad;
    net->bias.fill_(value);
    written.value = value;
  }
};
/// The same under zero2 with AdamW, whose state (each process's shard, saved whole) is set with the bias: a
/// checkpoint whose optimizer.bin comes from another save than its weights shows as moments that differ from the bias.
struct sharded_saver {
  using accelerator = accel::accelerator<accel::fp32, accel::zero2<accel::gloo>>;
  /// ACCEL_TEST_STATE_DICT=sharded: each process writes its own shard files.
  static accel::options saving_options() {
    const char* format = std::getenv("ACCEL_TEST_STATE_DICT");
    const bool sharded = format != nullptr && std::string(format) == "sharded";
    return {.sharding = {.state_dict = sharded ? accel::state_dict_type::sharded : accel::state_dict_type::full}};
  }
  accelerator acc{saving_options()};
  torch::nn::Linear net{1000, 2500};
  torch::optim::AdamW adamw{net->parameters(), torch::optim::AdamWOptions(1e-3)};
  decltype(std::declval<accelerator&>().prepare(
      std::declval<torch::nn::Linear&>(), std::declval<torch::optim::AdamW&>())) prepared = acc.prepare(net, adamw);
  tag written;
  sharded_saver() {
    acc.register_for_checkpointing(written);
    auto& [model, opt] = prepared;
    acc.backward(model(torch::ones({1, 1000})).sum());  // one step: AdamW's state exists
    opt.step();
    opt.zero_grad();
  }
  void set(double value) {
    torch::NoGradGuard no_grad;
    net->bias.fill_(value);
    for (auto& [key, state] : adamw.state()) static_cast<torch::optim::AdamWParamState&>(*state).exp_avg().fill_(value);
    written.value = value;
  }
  /// Whether the bias, the tag and this process's shard of every moment hold one value.
  [[nodiscard]] bool whole() {
    const double value = net->bias[0].item<double>();
    bool same = torch::all(net->bias == value).item<bool>() && written.value == value;
    for (auto& [key, state] : adamw.state())
      same = same && torch::all(static_cast<torch::optim::AdamWParamState&>(*state).exp_avg() == value).item<bool>();
    return same;
  }
};
}  // namespace

int run(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string mode = argv[1];
  if (mode == "save-loop") {  // saves checkpoint after checkpoint into the same directory until killed
    saver s;
    for (int i = 0;; ++i) {
      s.set(i);
      s.acc.save_state(argv[2]);
      std::printf("saved %d\n", i);
      std::fflush(stdout);
    }
  }
  if (mode == "save") {  // one save, for synced_save.cmake (run under strace)
    saver s;
    s.set(1);
    s.acc.save_state(argv[2]);
    return 0;
  }
  if (mode == "save-as" && argc == 4) {  // `save-as DIR ID`: 8 saves while another process saves there too
    saver s;
    const int id = std::stoi(argv[3]);
    int saved = 0, refused = 0;
    for (int attempt = 0; saved < 8 && attempt < 2000; ++attempt) {
      s.set(id * 1000 + attempt);
      try {
        s.acc.save_state(argv[2]);
        ++saved;
      } catch (const accel::checkpoint_error& e) {
        if (std::string(e.what()).find("another process is saving into") == std::string::npos) throw;
        ++refused;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // then try again, as a retrying job would
      }
    }
    std::printf("process %d: %d saves, %d refused while the other saved\n", id, saved, refused);
    return saved == 8 ? 0 : 1;
  }
  if (mode == "verify") {  // the checkpoint there loads, whole
    saver s;
    s.acc.load_state(argv[2]);
    const bool whole =
        torch::all(s.net->bias == s.net->bias[0]).item<bool>() && s.written.value == s.net->bias[0].item<double>();
    std::printf("checkpoint with bias %g and tag %g loaded: %s\n", s.net->bias[0].item<double>(), s.written.value,
                whole ? "whole" : "mixed");
    return whole ? 0 : 1;
  }
  if (mode == "load-loop" && argc == 4) {  // `load-loop DIR N`: N loads while a save-loop re-saves DIR
    saver s;
    const int loads = std::stoi(argv[3]);
    int failed = 0, mixed = 0;
    for (int i = 0; i < loads; ++i) try {
        s.acc.load_state(argv[2]);
        const bool whole =
            torch::all(s.net->bias == s.net->bias[0]).item<bool>() && s.written.value == s.net->bias[0].item<double>();
        mixed += whole ? 0 : 1;
      } catch (const accel::checkpoint_error& e) {
        std::printf("load %d failed: %s\n", i, e.what());
        ++failed;
      }
    std::printf("%d loads while another process re-saved: %d failed, %d mixed\n", loads, failed, mixed);
    return failed == 0 && mixed == 0 ? 0 : 1;
  }
  if (mode == "sharded-save-loop") {  // every process: saves until killed, after writing DIR.pid<RANK>
    sharded_saver s;
    std::ofstream(std::string(argv[2]) + ".pid" + std::to_string(s.acc.process_index())) << getpid() << "\n";
    for (int i = 0;; ++i) {
      s.set(i);
      s.acc.save_state(argv[2]);
      if (s.acc.is_main_process()) std::printf("saved %d\n", i);
      std::fflush(stdout);
    }
  }
  if (mode == "sharded-verify") {  // the checkpoint there loads, whole, on every process
    sharded_saver s;
    s.acc.load_state(argv[2]);
    const bool whole = s.whole();
    std::printf("process %d: checkpoint with bias %g loaded: %s\n", s.acc.process_index(),
                s.net->bias[0].item<double>(), whole ? "whole" : "mixed");
    return whole ? 0 : 1;
  }
  if (mode == "reference-state") {  // tests/data/checkpoint-v0.1 (see accel_test::reference_accelerator)  //
                                    // tests/data/checkpoint-v0.1 (see accel_test::reference_accelerator)
    const std::filesystem::path dir = argv[2];
    {
      accel_test::resumable_run<accel_test::reference_accelerator> run(7, 40);
      accel_test::reference_counter counter{.value = 1234};
      run.acc.register_for_checkpointing(counter);
      run.train_accumulating(accel_test::reference_steps_before_save);
      run.acc.save_state(dir / "checkpoint");
    }
    accel_test::resumable_run<accel_test::reference_accelerator> uninterrupted(7, 40);
    uninterrupted.train_accumulating(accel_test::reference_steps_before_save + accel_test::reference_steps_after_save);
    accel::save_model(*uninterrupted.net, dir / "weights-after");
    return 0;
  }
  if (mode == "write") {  // one tensor of every dtype accel writes, with values Python checks exactly
    accel::safetensors::save(argv[2], {{"fc.weight", torch::arange(6, torch::kFloat).reshape({2, 3}) / 4},
                                       {"fc.bias", torch::tensor({-1.5, 2.25}, torch::kDouble)},
                                       {"steps", torch::tensor({7, 8, 9}, torch::kLong)},
                                       {"half", torch::tensor({0.5f, -2.0f}).to(torch::kBFloat16)},
                                       {"float16", torch::tensor({0.1f, 65504.0f, -0.0f}).to(torch::kHalf)},
                                       {"int32", torch::tensor({-2147483647 - 1, 2147483647}, torch::kInt)},
                                       {"int16", torch::tensor({-32768, 32767}, torch::kShort)},
                                       {"int8", torch::tensor({-128, 127}, torch::kChar)},
                                       {"uint8", torch::tensor({0, 255}, torch::kByte)},
                                       {"flags", torch::tensor({true, false, true})},
                                       {"scalar", torch::tensor(3.5f)},
                                       {"empty", torch::zeros({0, 4})}});
    return 0;
  }
  // A state dict saved by Python's torch (tests/scripts/checkpoint_interop.py write) loads into the same architecture
  // built with LibTorch, by name (parameters and buffers); the loaded model reproduces Python's eval output and is
  // saved back, sharded, for Python to compare with its original state dict.
  const std::filesystem::path dir = argv[2];
  torch::nn::Sequential net(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3), torch::nn::ReLU(),
                            torch::nn::Linear(3, 2));
  accel::load_model(*net, dir / "python_state.safetensors");
  std::map<std::string, torch::Tensor> probe;
  for (auto& [name, tensor] : accel::safetensors::load(dir / "python_probe.safetensors")) probe[name] = tensor;
  net->eval();
  torch::NoGradGuard no_grad;
  const double difference = (net->forward(probe.at("x")) - probe.at("y")).abs().max().item<double>();
  std::printf("python's state dict loaded into torch::nn::Sequential by name; eval output differs by %g\n", difference);
  accel::save_model(*net, dir / "roundtrip", 64);  // 64-byte shards: several files and an index
  return difference <= 1e-6 ? 0 : 1;
}

}  // namespace programs::checkpoint_tool
