// `accel test`: runs accel-selftest's checks (tools/accel_selftest.cpp) in N processes (2 by default) under
// `accel launch` on a free port. The run is about the machine, not the user's settings: the config file and
// Accelerate's run variables are left out. The last line says "accel works on this machine", or what failed.
#include "test.hpp"

#include <cstdio>
#include <cstdlib>

#include "arguments.hpp"
#include "launch.hpp"
#include "selftest_program.hpp"

namespace accel::cli {

int test_main(const std::vector<std::string>& args) {
  launch_options options;
  options.nproc_per_node = 2;
  options.master_port = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const option_token option = split_option(args[i]);
    if (option.name == "help" || option.name == "h") {
      std::puts(
          "usage: accel test [--nproc_per_node N]\n\n"
          "Runs accel-selftest in N processes (default 2) with data_parallel<gloo> under accel launch: an\n"
          "all-reduce, gather_object, N processes x batch B training equal to 1 process x batch N*B, and\n"
          "save_state/load_state. Ends with \"accel works on this machine\" or says what failed.");
      return exit_ok;
    }
    if (option.name != "nproc_per_node") throw usage_error("unknown option '" + option.spelling + "'");
    bool used_next = false;
    const std::string value = option_value(option, i + 1 < args.size() ? &args[i + 1] : nullptr, used_next);
    i += used_next ? 1 : 0;
    options.nproc_per_node = static_cast<int>(parse_whole_number(option, value, 1, 64, "processes to test with"));
  }
  const auto program = selftest_program();
  if (!program) {
    std::fprintf(stderr, "accel test: FAILED: %s\n", selftest_missing_message().c_str());
    return 1;
  }
  setenv("ACCEL_CONFIG_FILE", "", 1);
  unsetenv("ACCELERATE_MIXED_PRECISION");
  unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
  std::printf("accel test: %d processes of %s\n", options.nproc_per_node, program->c_str());
  std::fflush(stdout);
  options.program = {program->string(), "test"};
  const int code = run_launch(options);
  if (code != 0) {
    std::fprintf(stderr,
                 "accel test: FAILED (exit code %d); the messages above say what went wrong; 'accel env' "
                 "prints the setup to include in a bug report\n",
                 code);
  }
  return code;
}

}  // namespace accel::cli
