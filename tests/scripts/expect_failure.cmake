# Passes when building TARGET fails and the compiler's output contains the regular expression EXPECTED. For a
# failed concept, g++ and clang show the message as the quoted source of the failing constraint, which is printed
# only when that constraint is the one that failed.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but it must not")
endif()
if(NOT out MATCHES "${EXPECTED}")
  message(FATAL_ERROR "${TARGET} failed, but without the expected diagnostic `${EXPECTED}`:\n${out}")
endif()
message("${TARGET} fails as expected: ${EXPECTED}")
