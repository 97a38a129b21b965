# Runs a 3-process job in which process 1 throws while the others train: `accel launch` must exit non-zero within
# 10 seconds (the others terminated or failed on the broken connection), never hang.
string(TIMESTAMP start "%s")
execute_process(COMMAND ${LAUNCHER} launch --nproc_per_node 3 --master_port 0 ${PROGRAM} "[crash]"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
string(TIMESTAMP stop "%s")
math(EXPR seconds "${stop} - ${start}")
message(STATUS "accel launch exited with ${rc} after ${seconds} s\n${err}")
if(rc EQUAL 0 OR NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "expected a non-zero exit code, got '${rc}'")
endif()
if(seconds GREATER 10)
  message(FATAL_ERROR "the job took ${seconds} s to end after a process failed (limit 10 s)")
endif()
if(NOT out MATCHES "process 1 fails on purpose" AND NOT err MATCHES "process 1 fails on purpose")
  message(FATAL_ERROR "the failing process's error was not shown:\n${out}\n${err}")
endif()
