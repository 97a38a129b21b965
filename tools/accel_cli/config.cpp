// `accel config`: the file's current settings (or the defaults when there is none), with those given on the command
// line changed, written back atomically and printed. Every key is accel/config_file.hpp's: the same names and checks
// as in the file, which is what `accel launch` and the programs' accel::read_run_config() read.
#include "config.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "accel/config_file.hpp"
#include "arguments.hpp"

namespace accel::cli {
namespace {

const char* config_usage() {
  return "usage: accel config [--config_file F] [--KEY VALUE ...]\n"
         "\n"
         "Writes the config file that 'accel launch' (its defaults) and accel::read_run_config() (which\n"
         "configuration accel::dispatch builds) read, keeping the settings it already has and changing those\n"
         "given. Without a file yet, it starts from mixed_precision no, gradient_accumulation_steps 1,\n"
         "num_processes 1, num_machines 1.\n"
         "\n"
         "options:\n"
         "  --config_file F                  the file (default: $ACCEL_CONFIG_FILE, else\n"
         "                                   $XDG_CONFIG_HOME/accel/default_config.yaml or\n"
         "                                   ~/.config/accel/default_config.yaml)\n"
         "  --mixed_precision M              no, bf16, fp16 or fp8\n"
         "  --gradient_accumulation_steps N  micro-batches per optimizer step\n"
         "  --distributed_type T             NO, MULTI_CPU, MULTI_GPU, FSDP or DEEPSPEED: the parallel policy\n"
         "                                   accel::dispatch builds, among those the program compiled\n"
         "  --num_processes N                processes in the whole job (over every machine)\n"
         "  --num_machines K                 machines (nodes)\n"
         "  --machine_rank I                 this machine's index, 0 on the main one\n"
         "  --main_process_ip A              the main machine's host name or IP address\n"
         "  --main_process_port P            its TCP port (0: accel launch picks a free one)\n"
         "  --parallelism_config_dp_replicate_size N, --parallelism_config_dp_shard_size N,\n"
         "  --parallelism_config_cp_size N, --parallelism_config_tp_size N, --parallelism_config_pp_size N\n"
         "                                   the device mesh (Accelerate's parallelism_config block): sizes that\n"
         "                                   multiply to num_processes\n"
         "  --parallelism_config_cp_comm_strategy S\n"
         "                                   allgather or alltoall: how context parallelism passes keys and values\n"
         "  -h, --help                       show this help\n"
         "\n"
         "example:\n"
         "  accel config --mixed_precision bf16 --num_processes 2 && accel launch ./train\n";
}

config_values defaults() {
  config_values values;
  values.mixed_precision = "no";
  values.gradient_accumulation_steps = 1;
  values.num_processes = 1;
  values.num_machines = 1;
  return values;
}

std::filesystem::path chosen_path(const std::optional<std::string>& given) {
  if (given) return *given;
  if (auto path = config_file_path()) return *path;
  throw usage_error(
      std::getenv("ACCEL_CONFIG_FILE") != nullptr
          ? "no config file to write: ACCEL_CONFIG_FILE is set empty (no config file); give --config_file F"
          : "no config file to write: neither XDG_CONFIG_HOME nor HOME is set; give --config_file F");
}

}  // namespace

int config_main(const std::vector<std::string>& args) {
  std::optional<std::string> file;
  std::vector<std::pair<option_token, std::string>> settings;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (!args[i].starts_with("-")) throw usage_error("unexpected argument '" + args[i] + "'; settings are --KEY VALUE");
    const option_token option = split_option(args[i]);
    if (option.name == "help" || option.name == "h") {
      std::fputs(config_usage(), stdout);
      return exit_ok;
    }
    bool used_next = false;
    std::string value = option_value(option, i + 1 < args.size() ? &args[i + 1] : nullptr, used_next);
    i += used_next ? 1 : 0;
    if (option.name == "config_file")
      file = value;
    else
      settings.emplace_back(option, value);
  }
  const std::filesystem::path path = chosen_path(file);
  std::error_code ignored;
  config_values values = std::filesystem::exists(path, ignored) ? read_config_file(path) : defaults();
  try {
    for (const auto& [option, value] : settings) set_config_value(values, option.name, value, option.spelling);
    check_config(values, "the settings");
  } catch (const config_error& e) {
    throw usage_error(e.what());
  }
  write_config_file(path, values);
  std::printf("accel config: wrote %s\n%s", path.c_str(), format_config(values).c_str());
  return exit_ok;
}

}  // namespace accel::cli
