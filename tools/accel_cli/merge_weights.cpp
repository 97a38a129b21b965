// `accel merge-weights [flags] CHECKPOINT OUT` (Accelerate's `accelerate merge-weights`): reading safetensors and
// LibTorch archives needs LibTorch, which this tool does without, so accel-selftest does the work
// (accel::merge_weights in accel/checkpoint.hpp); this command checks the command line and hands over.
#include "merge_weights.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "arguments.hpp"
#include "selftest_program.hpp"

namespace accel::cli {
namespace {

// Accelerate 1.15's flags (merge.py), both switches; accel-selftest takes them as written here.
constexpr std::string_view accepted_flags[] = {"unsafe_serialization", "remove_checkpoint_dir"};

constexpr const char* merge_weights_usage_text =
    "usage: accel merge-weights [--unsafe_serialization] [--remove_checkpoint_dir] CHECKPOINT OUT\n\n"
    "Writes the full weights of the checkpoint directory CHECKPOINT (what save_state wrote) into the directory\n"
    "OUT: model.safetensors, and model_1.safetensors ... for further models. A sharded checkpoint\n"
    "(state_dict_type::sharded) is assembled from every process's model_shard_{r}.safetensors; a full one's\n"
    "weights are written again. Every file is checked against the checkpoint's manifest first.\n\n"
    "options (Accelerate's merge-weights flags; dashes work as well as underscores):\n"
    "  --unsafe_serialization  write PyTorch's pickled pytorch_model.bin (pytorch_model_1.bin ...) instead of\n"
    "                          safetensors (not recommended: loading a pickle can run code)\n"
    "  --remove_checkpoint_dir remove CHECKPOINT once every file is written (refused when OUT is inside it)\n"
    "  -h, --help              show this help\n";

// The directories, and the flags as accel-selftest reads them ("--unsafe_serialization"); throws usage_error naming
// a flag it does not know.
void read_arguments(const std::vector<std::string>& args, std::vector<std::string>& directories,
                    std::vector<std::string>& flags) {
  bool options_ended = false;
  for (const std::string& argument : args) {
    if (options_ended || !argument.starts_with("-") || argument == "-") {
      directories.push_back(argument);
      continue;
    }
    if (argument == "--") {
      options_ended = true;
      continue;
    }
    const option_token option = split_option(argument);
    bool known = false;
    for (const std::string_view flag : accepted_flags) known = known || option.name == flag;
    if (!known)
      throw usage_error("unknown option '" + option.spelling +
                        "': accel merge-weights takes --unsafe_serialization and --remove_checkpoint_dir");
    if (option.value) throw usage_error(option.spelling + " takes no value; write just " + option.spelling);
    flags.push_back("--" + option.name);
  }
  if (directories.size() != 2)
    throw usage_error("expected a checkpoint directory and an output directory, got " +
                      std::to_string(directories.size()) + " paths");
}

}  // namespace

int merge_weights_main(const std::vector<std::string>& args) {
  if (!args.empty() && (split_option(args[0]).name == "help" || split_option(args[0]).name == "h")) {
    std::fputs(merge_weights_usage_text, stdout);
    return exit_ok;
  }
  std::vector<std::string> directories, flags;
  read_arguments(args, directories, flags);
  const auto program = selftest_program();
  if (!program) {
    std::fprintf(stderr, "accel merge-weights: error: %s\n", selftest_missing_message().c_str());
    return 1;
  }
  const std::string path = program->string();
  std::vector<char*> argv{const_cast<char*>(path.c_str()), const_cast<char*>("merge-weights"),
                          const_cast<char*>(directories[0].c_str()), const_cast<char*>(directories[1].c_str())};
  for (std::string& flag : flags) argv.push_back(flag.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  execv(argv[0], argv.data());
  std::fprintf(stderr, "accel merge-weights: error: cannot run %s: %s\n", path.c_str(), std::strerror(errno));
  return 1;
}

}  // namespace accel::cli
