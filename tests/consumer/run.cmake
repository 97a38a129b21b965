# Builds and runs a separate project that uses accel, in one of three ways (MODE):
# - torch_config: accel installed from its build tree into a scratch prefix, found with find_package(accel CONFIG);
# - layout: the same, but the consumer ignores LibTorch's TorchConfig.cmake, so that accel's other way of finding
#   LibTorch (the header and library layout) is used;
# - subdirectory: accel's source tree added with add_subdirectory.
file(REMOVE_RECURSE ${WORK_DIR})
set(install_step "${CMAKE_COMMAND};--install;${ACCEL_BUILD_DIR};--prefix;${WORK_DIR}/prefix")
# The consumer uses the LibTorch accel was built with: the directory above its TorchConfig.cmake and
# Caffe2Config.cmake (TORCH_CMAKE_PREFIX) as the prefix path, or, for the layout, its installation prefix
# (TORCH_PREFIX: include/ and lib/ below it); either is searched before the system's (Debian's LibTorch).
set(mode_flags "-Daccel_ROOT=${WORK_DIR}/prefix" "-DCMAKE_PREFIX_PATH=${TORCH_CMAKE_PREFIX}")
if(MODE STREQUAL "layout")
  set(mode_flags "-Daccel_ROOT=${WORK_DIR}/prefix" "-DCMAKE_PREFIX_PATH=${TORCH_PREFIX}"
                 "-DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON")
elseif(MODE STREQUAL "subdirectory")
  set(install_step "${CMAKE_COMMAND};-E;true")
  set(mode_flags "-DACCEL_SOURCE_DIR=${ACCEL_SOURCE_DIR}" "-DCMAKE_PREFIX_PATH=${TORCH_CMAKE_PREFIX}")
endif()
# Each way builds one consumer, so that each of the package's two libraries is built and run against it: the
# header-only one (accel::accel) found through TorchConfig.cmake and added as a subdirectory, the compiled part
# (accel::compiled, the library the package installed) found through the layout. Which finds LibTorch is the same
# code for both; building both in every way cost CI a minute of its two cores.
set(consumer consumer)
if(MODE STREQUAL "layout")
  set(consumer consumer_compiled)
endif()
# A Release build, whose configuration the installed package's (Release) matches, without the optimizer: what is
# checked is that the consumer compiles, links and runs, and -O3 only adds to the time the compiler spends parsing
# torch/torch.h and accel's headers (-O0: 50 s of CPU time for the header-only program against 63 s, 38 s for the
# compiled one against 44 s, on CI's 2-core machine).
foreach(step
    "${install_step}"
    "${CMAKE_COMMAND};-S;${CONSUMER_SOURCE_DIR};-B;${WORK_DIR}/build;-G;${CMAKE_GENERATOR};-DCMAKE_BUILD_TYPE=Release;-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG;-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER};${mode_flags}"
    "${CMAKE_COMMAND};--build;${WORK_DIR}/build;--target;${consumer}"
    "${WORK_DIR}/build/${consumer}")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer step failed (${rc}): ${step}")
  endif()
endforeach()

# The installed package's version: find_package(accel 0.9) found it (above); a request for another minor version is
# refused (SameMinorVersion: before 1.0 a minor version may change the API), naming the version it considered.
if(MODE STREQUAL "torch_config")
  file(WRITE ${WORK_DIR}/version-check/CMakeLists.txt
       "cmake_minimum_required(VERSION 3.25)\nproject(version_check LANGUAGES NONE)\n"
       "find_package(accel 0.8 CONFIG QUIET)\nmessage(\"found=\${accel_FOUND} considered=\${accel_CONSIDERED_VERSIONS}\")\n")
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${WORK_DIR}/version-check -B ${WORK_DIR}/version-check/build
                          -Daccel_ROOT=${WORK_DIR}/prefix RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0 OR NOT out MATCHES "found=0 considered=${ACCEL_VERSION}")
    message(FATAL_ERROR "the installed package (version ${ACCEL_VERSION}) did not refuse a request for 0.8")
  endif()
endif()

# The installed `accel test` (bin/accel with libexec/accel/accel-selftest): a 2-process sanity run of the installed
# library, as a user checks a fresh installation.
if(NOT MODE STREQUAL "subdirectory")
  execute_process(COMMAND ${WORK_DIR}/prefix/bin/accel test RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0 OR NOT out MATCHES "accel works on this machine\n$")
    message(FATAL_ERROR "the installed accel test failed (${rc}) or did not end with \"accel works on this machine\"")
  endif()
endif()
