// This process's resident set, for the tests and benchmarks that measure what memory a loop keeps.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>

namespace accel_test {

/// This process's resident set in bytes (/proc/self/statm's second field, in pages).
inline std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace accel_test
