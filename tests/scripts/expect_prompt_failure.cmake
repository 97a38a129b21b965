# Runs a 3-process job in which process 1 throws while the others train: `accel launch` must exit non-zero within
# 10 seconds of the failure (the others terminated or failed on the broken connection), never hang. Process 1 says
# when it throws (seconds since the epoch), so that starting the job on a loaded machine does not count.
execute_process(COMMAND ${LAUNCHER} launch --nproc_per_node 3 --master_port 0 ${PROGRAM} "[crash]"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
string(TIMESTAMP stop "%s" UTC)
message(STATUS "accel launch exited with ${rc}\n${err}")
if(rc EQUAL 0 OR NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "expected a non-zero exit code, got '${rc}'")
endif()
if(NOT "${out}${err}" MATCHES "process 1 fails on purpose at ([0-9]+) s")
  message(FATAL_ERROR "the failing process's error (saying when it failed) was not shown:\n${out}\n${err}")
endif()
math(EXPR seconds "${stop} - ${CMAKE_MATCH_1}")
message(STATUS "the job ended ${seconds} s after process 1 failed")
if(seconds GREATER 10)
  message(FATAL_ERROR "the job took ${seconds} s to end after a process failed (limit 10 s)")
endif()
