/// \file
/// `accel fr-trace`'s analysis (torchfrtrace's, in C++): every process's flight record from a directory of dumps
/// (flight_recorder.hpp's, or PyTorch's own), matched collective by collective within each process group, and a
/// verdict per group naming the processes missing from a collective, or the processes that called another
/// collective (or sizes, or dtypes) at the same sequence number. No LibTorch: the `accel` tool includes it.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../support/pickle_value.hpp"

namespace accel::detail {

/// One collective of one process's dump, as the analysis reads it.
struct traced_collective {
  std::int64_t sequence = 0;
  std::string operation;                  // the profiling name without its backend: all_reduce
  std::string input_sizes, input_dtypes;  // as text, compared whole
  std::string state;
  std::string issued_by;  // accel's label, else the first frame's name, else empty
};

/// A process's dump: its rank, its groups' members and its collectives per group (p2p operations left out).
struct process_trace {
  int rank = 0;
  std::string file;
  std::map<std::string, std::vector<int>> groups;
  std::map<std::string, std::vector<traced_collective>> collectives;  // per group, in record order
};

/// The dump `bytes` read from `file` of process `rank` (the number its name ends with); `std::invalid_argument`
/// naming the file when it is not a flight record.
[[nodiscard]] ACCEL_DECL process_trace read_process_trace(const std::string& bytes, const std::string& file, int rank);

/// Every dump of `directory`: files whose names end with a process number (hidden ones left out).
[[nodiscard]] ACCEL_DECL std::vector<process_trace> read_trace_directory(const std::string& directory);

/// What the analysis found.
struct trace_verdict {
  std::vector<std::string> problems;  // one sentence each: a missing process, a desynchronised collective
  std::vector<std::string> notes;     // groups that matched throughout
};

/// Matches the processes' collectives group by group, from the first sequence number every member's ring still
/// holds; stops at each group's first problem.
[[nodiscard]] ACCEL_DECL trace_verdict analyse_traces(const std::vector<process_trace>& traces);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/flight_trace.ipp"
#endif
