// The test programs of tests/programs/ are one binary, accel_test_programs, so that the accel templates they share
// are compiled once (tests/CMakeLists.txt). Each is started through a link beside it named accel_PROGRAM, as the
// program of its own it was: the name it is started by picks the program.
#include <cstdio>
#include <filesystem>
#include <string>

#define ACCEL_TEST_PROGRAM(name, link) \
  namespace programs::name {           \
  int run(int argc, char** argv);      \
  }
#include "test_programs.inc"  // ACCEL_TEST_PROGRAM(name, link) for each program, written by tests/CMakeLists.txt
#undef ACCEL_TEST_PROGRAM

int main(int argc, char** argv) {
  const auto started_as = std::filesystem::path(argv[0]).filename().string();
#define ACCEL_TEST_PROGRAM(name, link) \
  if (started_as == link) return programs::name::run(argc, argv);
#include "test_programs.inc"
#undef ACCEL_TEST_PROGRAM
  std::fprintf(stderr,
               "accel_test_programs: started as %s, which is none of its programs: start it through one of the "
               "links beside it (tests/CMakeLists.txt makes them)\n",
               started_as.c_str());
  return 2;
}
