# A process saving checkpoint after checkpoint into one directory is killed (SIGKILL) at moments spread over a save;
# each time, the directory must hold a complete checkpoint that loads.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(state ${WORK_DIR}/state)
foreach(delay IN ITEMS 0.3 0.45 0.6 0.75 0.9 1.05)
  # timeout sends SIGKILL after `delay` seconds past the first complete save (the loop prints "saved 0" first)
  execute_process(COMMAND bash -c "'${TOOL}' save-loop '${state}' & pid=$!; for i in $(seq 600); do [ -d '${state}' ] && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done; sleep ${delay}; kill -9 $pid; wait $pid 2>/dev/null; true"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  execute_process(COMMAND ${TOOL} verify ${state} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "killed after ${delay} s: ${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "after a kill mid-save the checkpoint does not load (${rc}):\n${out}\n${err}")
  endif()
endforeach()
