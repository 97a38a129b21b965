# A 2-process zero2 job saving checkpoint after checkpoint into one directory (each save gathers the optimizer's
# whole state; with -DSTATE_DICT=sharded, each process writes its own shard files instead) loses one process to
# SIGKILL at moments spread over a save, process 1 and process 0 in turn; the launcher then ends the job. Each time,
# the directory must hold a complete checkpoint that a new 2-process job loads whole: weights, tag and every
# process's shard of the optimizer state from one save.
if(NOT DEFINED STATE_DICT)
  set(STATE_DICT full)
endif()
set(ENV{ACCEL_TEST_STATE_DICT} ${STATE_DICT})
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(state ${WORK_DIR}/state)
set(rank 1)
foreach(delay IN ITEMS 0.2 0.4 0.6 0.8 1.0 1.2)
  file(REMOVE ${state}.pid0 ${state}.pid1)
  # Waits for the first complete save (the directory) and both pid files, sleeps, kills one process; the launcher
  # must end the job promptly (within the 60 s of this step).
  execute_process(COMMAND bash -c "'${LAUNCHER}' launch --nproc_per_node 2 --master_port 0 '${TOOL}' sharded-save-loop '${state}' & job=$!; for i in $(seq 1200); do [ -d '${state}' ] && [ -s '${state}.pid0' ] && [ -s '${state}.pid1' ] && break; kill -0 $job 2>/dev/null || break; sleep 0.05; done; sleep ${delay}; kill -9 $(cat '${state}.pid${rank}'); wait $job; true"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the job did not end after process ${rank} was killed (${rc}):\n${out}\n${err}")
  endif()
  execute_process(COMMAND ${LAUNCHER} launch --nproc_per_node 2 --master_port 0 ${TOOL} sharded-verify ${state}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  message(STATUS "process ${rank} killed ${delay} s after a save: ${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "after a kill mid-save the checkpoint does not load whole (${rc}):\n${out}\n${err}")
  endif()
  math(EXPR rank "1 - ${rank}")
endforeach()
