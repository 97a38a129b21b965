# Installs accel from its build tree into a scratch prefix, then configures, builds and runs a separate project
# that finds it with find_package(accel CONFIG). TORCH_LOOKUP=layout makes the consumer ignore LibTorch's
# TorchConfig.cmake, so that accel's other way of finding LibTorch (the header and library layout) is used.
file(REMOVE_RECURSE ${WORK_DIR})
set(lookup_flags "")
if(TORCH_LOOKUP STREQUAL "layout")
  set(lookup_flags "-DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON")
endif()
foreach(step
    "${CMAKE_COMMAND};--install;${ACCEL_BUILD_DIR};--prefix;${WORK_DIR}/prefix"
    "${CMAKE_COMMAND};-S;${CONSUMER_SOURCE_DIR};-B;${WORK_DIR}/build;-G;${CMAKE_GENERATOR};-DCMAKE_BUILD_TYPE=Release;-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER};-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix;${lookup_flags}"
    "${CMAKE_COMMAND};--build;${WORK_DIR}/build"
    "${WORK_DIR}/build/consumer")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer step failed (${rc}): ${step}")
  endif()
endforeach()
