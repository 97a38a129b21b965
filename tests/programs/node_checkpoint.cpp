// For tests/scripts/save_on_each_node.py: `node_checkpoint save DIR [on_each_node]` and `node_checkpoint resume DIR`,
// run as a job of 2 nodes of 2 Gloo processes (two `accel launch --nnodes 2` on one machine, each in a working
// directory of its own, so that a relative DIR is on each "node's disk").
//   save:   5 training steps (dropout, AdamW, a scheduler, a shuffled loader), then save_state(DIR), with
//           options::project.save_on_each_node when `on_each_node` is given.
//   resume: 10 uninterrupted steps, and load_state(DIR) into objects built from another seed followed by 5 steps;
//           both must end with the same parameters, bit for bit.
// Every process prints one line saying what it did (or the checkpoint_error it got) and exits non-zero on failure.
#include <accel/accel.hpp>
#include <torch/torch.h>

#include "support.hpp"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

namespace {
using accelerator = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
using run = accel_test::resumable_run<accelerator>;
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc >= 3 ? argv[1] : "";
  const bool on_each_node = argc == 4 && std::string(argv[3]) == "on_each_node";
  if ((mode != "save" && mode != "resume") || (argc == 4 && !on_each_node) || argc > 4) {
    std::fprintf(stderr, "usage: node_checkpoint save DIR [on_each_node] | node_checkpoint resume DIR\n");
    return 2;
  }
  const std::filesystem::path directory = argv[2];
  // A process left alone (its peer failed) gives up within a minute instead of the default half hour.
  const accel::options options{
      .cpu = true, .timeout = std::chrono::seconds(60), .project = {.save_on_each_node = on_each_node}};
  if (mode == "save") {
    run first_part(1, 64, options);
    first_part.train(5);
    const int rank = first_part.acc.process_index();
    try {
      first_part.acc.save_state(directory);
    } catch (const accel::checkpoint_error& e) {
      std::printf("node_checkpoint: rank %d save failed: %s\n", rank, e.what());
      std::fflush(stdout);
      // The save failed on every process together, so they can still meet: all have printed before any exits (the
      // launcher ends the others at the first exit).
      first_part.acc.wait_for_everyone();
      return 3;
    }
    std::printf("node_checkpoint: rank %d saved\n", rank);
    return 0;
  }
  run uninterrupted(1, 64, options);
  uninterrupted.train(10);
  run resumed(99, 64, options);
  const int rank = resumed.acc.process_index();
  try {
    resumed.acc.load_state(directory);
  } catch (const accel::checkpoint_error& e) {
    std::printf("node_checkpoint: rank %d load failed: %s\n", rank, e.what());
    std::fflush(stdout);
    return 3;
  }
  resumed.train(5);
  const bool same = accel_test::bitwise_equal(*resumed.net, *uninterrupted.net);
  std::printf("node_checkpoint: rank %d resumed %s\n", rank, same ? "bit for bit" : "with other parameters");
  std::fflush(stdout);
  return same ? 0 : 1;
}
