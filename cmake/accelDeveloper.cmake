# Build speed for accel's own development build (never exported): ccache, lld, a release build by default.
include_guard(GLOBAL)
include(CheckLinkerFlag)

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type" FORCE)
endif()

find_program(ACCEL_CCACHE ccache)
if(ACCEL_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  # These sloppiness settings let ccache cache translation units that use the precompiled header.
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime ${ACCEL_CCACHE})
endif()

check_linker_flag(CXX -fuse-ld=lld ACCEL_HAVE_LLD)
if(ACCEL_HAVE_LLD)
  add_link_options(-fuse-ld=lld)
endif()

# The compiler as a reviewer of accel's own code (the headers, through the tests, examples and tools that include
# them). LibTorch, Catch2 and range-v3 are imported targets, so their headers are system includes and their warnings
# stay theirs. scripts/test.sh (what CI runs) turns warnings into errors.
option(ACCEL_WARNINGS_AS_ERRORS "Treat compiler warnings as errors in accel's own targets" OFF)
add_compile_options(-Wall -Wextra -Wpedantic -Wshadow)
if(ACCEL_WARNINGS_AS_ERRORS)
  add_compile_options(-Werror)
endif()
