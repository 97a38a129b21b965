// `accel merge-weights CHECKPOINT OUT` (Accelerate's `accelerate merge-weights`): reading safetensors and LibTorch
// archives needs LibTorch, which this tool does without, so accel-selftest does the work (accel::merge_weights in
// accel/checkpoint.hpp); this command checks the command line and hands over.
#include "merge_weights.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "arguments.hpp"
#include "selftest_program.hpp"

namespace accel::cli {

int merge_weights_main(const std::vector<std::string>& args) {
  if (!args.empty() && (split_option(args[0]).name == "help" || split_option(args[0]).name == "h")) {
    std::puts(
        "usage: accel merge-weights CHECKPOINT OUT\n\n"
        "Writes the full weights of the checkpoint directory CHECKPOINT (what save_state wrote) into the directory\n"
        "OUT: model.safetensors, and model_1.safetensors ... for further models. A sharded checkpoint\n"
        "(state_dict_type::sharded) is assembled from every process's model_shard_{r}.safetensors; a full one's\n"
        "weights are written again. Every file is checked against the checkpoint's manifest first.");
    return exit_ok;
  }
  if (args.size() != 2) throw usage_error("expected a checkpoint directory and an output directory");
  const auto program = selftest_program();
  if (!program) {
    std::fprintf(stderr, "accel merge-weights: error: %s\n", selftest_missing_message().c_str());
    return 1;
  }
  const std::string path = program->string();
  std::vector<char*> argv{const_cast<char*>(path.c_str()), const_cast<char*>("merge-weights"),
                          const_cast<char*>(args[0].c_str()), const_cast<char*>(args[1].c_str()), nullptr};
  std::fflush(nullptr);
  execv(argv[0], argv.data());
  std::fprintf(stderr, "accel merge-weights: error: cannot run %s: %s\n", path.c_str(), std::strerror(errno));
  return 1;
}

}  // namespace accel::cli
