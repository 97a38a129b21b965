// Asynchronous checkpoints (save_options::asynchronous), alone or under `accel launch`:
//   `async_checkpoint equivalence POLICY DIR`: trains, saves the same state once while the program waits and once in
//     the background, trains on while the background save writes, then checks that the two checkpoints' files are
//     identical byte for byte, and that loading the background one restores the state it was taken from. POLICY:
//     data_parallel (full format), fully_sharded (sharded format), fully_sharded_full (the full format, gathered).
//   `async_checkpoint failure DIR`: a background save that cannot write raises its checkpoint_error on every process,
//     at wait_for_checkpoint, or at the next save when nothing waited; a skipped save (in_flight::skip) while one is
//     being written; then a save that works.
//   `async_checkpoint soak SAVES DIR`: SAVES background saves back to back beside training (automatic naming,
//     total_limit 2): each one complete, its files as its manifest lists them, every 100th loaded back; the resident
//     set flat once the first 220 have settled it (under 1 MiB more by the end; a snapshot kept per save is 60 MB).
#include "accel_headers.hpp"
#include <torch/torch.h>

#include "resident.hpp"
#include "support.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace programs::async_checkpoint {

namespace {

using batches_t = std::vector<accel_test::batch>;

/// Every file of the checkpoint in `directory`, by name, with its bytes.
std::map<std::string, std::string> files_in(const std::filesystem::path& directory) {
  std::map<std::string, std::string> files;
  for (const auto& entry : accel::detail::directory_entries(directory))
    if (entry.is_regular_file()) files[entry.path().filename().string()] = accel_test::text_of(entry.path());
  return files;
}

/// Every file the manifest of `directory` lists has the size and checksum listed.
void verify(const std::filesystem::path& directory) {
  const auto manifest = accel::detail::read_manifest(directory);
  if (!manifest) throw std::runtime_error(directory.string() + " has no manifest");
  for (const auto& [name, file] : manifest->files()) {
    const auto found = manifest->opened()->size_and_checksum(name);
    if (!found || found->first != file.size || found->second != file.crc32c)
      throw std::runtime_error(directory.string() + "/" + name + " is not as its manifest lists it");
  }
}

/// The model's parameters, copied.
std::vector<torch::Tensor> parameters_of(torch::nn::Module& model) {
  std::vector<torch::Tensor> copies;
  for (const auto& parameter : model.parameters()) copies.push_back(parameter.detach().clone());
  return copies;
}

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

/// Every parameter and optimizer state tensor changed in place, at once: a save that wrote live tensors instead of
/// its snapshot's copies would write these values (its files are written later, by its thread).
void disturb(torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  for (auto& parameter : model.parameters()) parameter.add_(1.0);
  for (auto& [key, state] : optimizer.state())
    accel::detail::visit_state(
        *state,
        [](std::string_view, at::Tensor& tensor) {
          if (tensor.defined()) tensor.add_(1.0);
        },
        [](std::string_view, std::int64_t& count) { count += 1; });
}

/// Trains `steps` steps of `batches` from `*next`.
template <class Acc, class Model, class Optimizer>
void train(Acc& acc, Model& model, Optimizer& opt, const batches_t& batches, std::size_t& next, int steps) {
  for (int i = 0; i < steps; ++i, ++next) {
    const auto& [x, y] = batches[next % batches.size()];
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  }
}

/// Empties `root` (the main process) once every process has its accelerator: a run starts from nothing.
template <class Acc>
void start_afresh(Acc& acc, const std::filesystem::path& root) {
  if (acc.is_main_process()) {
    accel::detail::remove_tree(root);
    std::filesystem::create_directories(root);
  }
  acc.wait_for_everyone();
}

template <class Parallel>
int equivalence(const std::filesystem::path& root, accel::state_dict_type format) {
  accel::accelerator<accel::fp32, Parallel> acc{accel::options{.cpu = true, .sharding = {.state_dict = format}}};
  start_afresh(acc, root);
  torch::manual_seed(5);
  accel_test::mlp net(16, 512, 4, /*dropout=*/0.2);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(net, optimizer);
  const auto batches = accel_test::regression_batches(8, 8, 16, 4, 11 + acc.process_index());
  torch::manual_seed(100 + acc.process_index());
  std::size_t next = 0;
  train(acc, model, opt, batches, next, 3);
  acc.save_state(root / "waited");
  const auto saved = acc.get_state_dict(model);
  acc.save_state(root / "background", {.asynchronous = true});
  // The snapshot is taken: neither this nor the steps after it change what the thread writes.
  disturb(*model, optimizer);
  train(acc, model, opt, batches, next, 3);
  const auto written = accel::wait_for_checkpoint(acc);
  if (!written || *written != root / "background") throw std::runtime_error("wait_for_checkpoint: not the save made");
  if (acc.is_main_process()) {
    const auto waited = files_in(root / "waited"), background = files_in(root / "background");
    if (waited != background) {
      for (const auto& [name, bytes] : waited)
        if (!background.contains(name) || background.at(name) != bytes)
          std::fprintf(stderr, "async_checkpoint: %s differs\n", name.c_str());
      throw std::runtime_error("the background save's files differ from the waited save's");
    }
    std::printf("async_checkpoint: %zu files identical byte for byte\n", waited.size());
  }
  acc.load_state(root / "background");
  const auto loaded = acc.get_state_dict(model);
  for (std::size_t i = 0; i < saved.size(); ++i)
    if (saved[i].first != loaded[i].first || !torch::equal(saved[i].second, loaded[i].second))
      throw std::runtime_error("loaded " + saved[i].first + " differs from what was saved");
  acc.wait_for_everyone();
  std::printf("async_checkpoint: process %d loaded the state the background save took\n", acc.process_index());
  return 0;
}

/// Runs `call`, which must raise a checkpoint_error that says `expected`.
template <class Call>
void expect_failure(const char* what, const std::string& expected, Call&& call) {
  try {
    call();
  } catch (const accel::checkpoint_error& e) {
    if (std::string(e.what()).find(expected) == std::string::npos)
      throw std::runtime_error(std::string(what) + ": the error does not say '" + expected + "': " + e.what());
    std::printf("async_checkpoint: %s: %s\n", what, e.what());
    return;
  }
  throw std::runtime_error(std::string(what) + ": no checkpoint_error");
}

int failure(const std::filesystem::path& root) {
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc{accel::options{
      .cpu = true, .project = {.project_dir = (root / "project").string(), .automatic_checkpoint_naming = true}}};
  start_afresh(acc, root);
  torch::manual_seed(5);
  accel_test::mlp net(16, 4096, 4);  // ~1 MB of weights, ~3 MB with AdamW's state: a write that takes a while
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(net, optimizer);
  const auto batches = accel_test::regression_batches(4, 8, 16, 4, 11 + acc.process_index());
  std::size_t next = 0;
  train(acc, model, opt, batches, next, 1);
  const auto blocked = root / "a_file";  // a file where the checkpoint's parent directory should be
  if (acc.is_main_process()) std::ofstream(blocked) << "not a directory";
  acc.wait_for_everyone();
  acc.save_state(blocked / "checkpoint", {.asynchronous = true});
  expect_failure("wait_for_checkpoint", "a_file", [&] { (void)accel::wait_for_checkpoint(acc); });
  acc.save_state(blocked / "checkpoint", {.asynchronous = true});
  train(acc, model, opt, batches, next, 1);
  expect_failure("the next save_state", "a_file", [&] { acc.save_state(root / "fine"); });
  // A save skipped while the one before it is being written (about 4 MB, synced: many milliseconds).
  const auto first = acc.save_state({.asynchronous = true});
  const auto skipped = acc.save_state({.asynchronous = true, .if_in_flight = accel::in_flight::skip});
  if (!skipped.empty())
    throw std::runtime_error("in_flight::skip saved " + skipped.string() + " beside " + first.string());
  acc.wait_for_everyone();
  verify(first);
  acc.save_state(root / "fine", {.asynchronous = true});
  acc.end_training();
  verify(root / "fine");
  std::printf("async_checkpoint: process %d: failures raised, a save skipped, then saved\n", acc.process_index());
  return 0;
}

int soak(int saves, const std::filesystem::path& root) {
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc{accel::options{
      .cpu = true,
      .project = {.project_dir = (root / "project").string(), .automatic_checkpoint_naming = true, .total_limit = 2}}};
  start_afresh(acc, root);
  torch::manual_seed(5);
  accel_test::mlp net(16, 256, 4);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(net, optimizer);
  const auto batches = accel_test::regression_batches(8, 8, 16, 4, 11 + acc.process_index());
  std::size_t next = 0;
  std::int64_t resident_early = 0, resident_later = 0;
  for (int save = 0; save < saves; ++save) {
    train(acc, model, opt, batches, next, 1);  // beside the previous save's writing
    if (const auto previous = accel::wait_for_checkpoint(acc); previous && acc.is_main_process()) verify(*previous);
    if (save % 100 == 99) {  // loaded back: the state it was taken from (nothing stepped since)
      const auto before = parameters_of(*model);
      acc.save_state({.asynchronous = true});
      acc.load_state();
      if (!same(before, parameters_of(*model))) throw std::runtime_error("a loaded save differs from its state");
      continue;
    }
    acc.save_state({.asynchronous = true});
    if (save == 19) resident_early = accel_test::resident_bytes();
    if (save == 219) resident_later = accel_test::resident_bytes();
    if (save % 100 == 19 && save > 19)
      std::printf("async_checkpoint: process %d: %d saves: resident set +%.2f MiB\n", acc.process_index(), save + 1,
                  static_cast<double>(accel_test::resident_bytes() - resident_early) / (1 << 20));
  }
  (void)accel::wait_for_checkpoint(acc);
  // The first loads and the allocator's arenas settle within 200 saves (about 5 MiB here, as with saves that block);
  // a snapshot kept per save would add 1,000 copies of the training state (60 MB).
  const auto resident_end = accel_test::resident_bytes();
  const double grown = static_cast<double>(resident_end - resident_early) / (1 << 20);
  const double grown_late = static_cast<double>(resident_end - resident_later) / (1 << 20);
  std::printf(
      "async_checkpoint: process %d: %d saves; resident set grew %.2f MiB after the 20th, %.2f after the 220th\n",
      acc.process_index(), saves, grown, grown_late);
  if (grown > 16 || grown_late > 1) throw std::runtime_error("the resident set grows with the saves");
  acc.end_training();
  return 0;
}

}  // namespace

int run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "equivalence" && argc == 4) {
    const std::string policy = argv[2];
    if (policy == "data_parallel")
      return equivalence<accel::data_parallel<accel::gloo>>(argv[3], accel::state_dict_type::full);
    if (policy == "fully_sharded")
      return equivalence<accel::fully_sharded<accel::gloo>>(argv[3], accel::state_dict_type::sharded);
    if (policy == "fully_sharded_full")
      return equivalence<accel::fully_sharded<accel::gloo>>(argv[3], accel::state_dict_type::full);
  }
  if (mode == "failure" && argc == 3) return failure(argv[2]);
  if (mode == "soak" && argc == 4) return soak(std::atoi(argv[2]), argv[3]);
  std::fprintf(stderr,
               "usage: async_checkpoint equivalence data_parallel|fully_sharded|fully_sharded_full DIR | failure DIR | "
               "soak SAVES DIR\n");
  return 2;
}

}  // namespace programs::async_checkpoint
