# Builds TARGETS (comma-separated: the units of docs' C++ blocks, tests/docs_snippets.cmake) and fails when one does
# not compile; prints SUMMARY, what was compiled and what was not.
string(REPLACE "," ";" TARGETS "${TARGETS}")
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGETS} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(EXISTS ${SUMMARY})
  file(READ ${SUMMARY} summary)
  message("${summary}")
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${out}\ndocs' C++ blocks do not compile: the diagnostics above name the Markdown lines")
endif()
list(FIND TARGETS docs_snippets_nccl nccl_index)
if(nccl_index EQUAL -1)
  message("the blocks that name accel::nccl were not compiled: accel::nccl was not found (NCCL and the CUDA runtime)")
endif()
message("every C++ block of docs/ compiles (${TARGETS})")
