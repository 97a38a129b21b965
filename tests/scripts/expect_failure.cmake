# Builds TARGET, which must fail (every file in tests/compile_fail/), and writes the build's output to OUTPUT, where
# each file's test (check_compile_fail.py) looks for its message. The output of an earlier run is removed first,
# so that no test reads a stale one.
file(REMOVE ${OUTPUT})
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but it must not: no file of tests/compile_fail/ fails any more")
endif()
file(WRITE ${OUTPUT} "${out}")
message("${TARGET} fails, as it must; each file's test checks its message in ${OUTPUT}")
