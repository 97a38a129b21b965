// `accel fr-trace DIR`: reads the dumps itself (accel/detail/comm/flight_trace.hpp needs no LibTorch), so it works
// on any machine the dumps are copied to.
#include "fr_trace.hpp"

#include <accel/detail/comm/flight_trace.hpp>

#include <cstdio>
#include <exception>

#include "arguments.hpp"

namespace accel::cli {
namespace {

constexpr const char* fr_trace_usage_text =
    "usage: accel fr-trace DIR\n\n"
    "Reads every process's flight record in DIR (accel_trace_rank_{rank}, written by a process's hang watch, a\n"
    "failed collective or accel::dump_flight_record into ACCEL_FLIGHT_RECORDER_DIR; PyTorch's own dumps too) and\n"
    "matches the collectives of each process group by sequence number: it names the processes missing from a\n"
    "collective, and the processes that called another collective, size or dtype at the same sequence number.\n"
    "Exits with 0 when every group matched, 1 when it found a problem, 3 when a dump cannot be read.\n\n"
    "options:\n"
    "  -h, --help  show this help\n";

}  // namespace

int fr_trace_main(const std::vector<std::string>& args) {
  if (!args.empty() && (split_option(args[0]).name == "help" || split_option(args[0]).name == "h")) {
    std::fputs(fr_trace_usage_text, stdout);
    return exit_ok;
  }
  if (args.size() != 1)
    throw usage_error("expected one directory of flight records, got " + std::to_string(args.size()));
  std::vector<detail::process_trace> traces;
  try {
    traces = detail::read_trace_directory(args[0]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel fr-trace: error: %s\n", e.what());
    return 3;
  }
  if (traces.empty()) {
    std::fprintf(stderr, "accel fr-trace: error: no flight record in %s (files named accel_trace_rank_N)\n",
                 args[0].c_str());
    return 3;
  }
  std::printf("accel fr-trace: %zu flight records in %s\n", traces.size(), args[0].c_str());
  const auto verdict = detail::analyse_traces(traces);
  for (const auto& problem : verdict.problems) std::printf("%s\n", problem.c_str());
  for (const auto& note : verdict.notes) std::printf("%s\n", note.c_str());
  return verdict.problems.empty() ? exit_ok : 1;
}

}  // namespace accel::cli
