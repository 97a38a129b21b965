# Issue 39, item 6: a process loads a checkpoint again and again while another re-saves the same directory. Every load
# reads one checkpoint, the old or the new, whole: none is reported damaged (it was, about half the time) or mixed.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(state ${WORK_DIR}/state)
execute_process(COMMAND bash -c "
  '${TOOL}' save-loop '${state}' > '${WORK_DIR}/saver.log' 2>&1 & saver=$!
  trap 'kill -9 $saver 2>/dev/null' EXIT
  for i in $(seq 300); do grep -q 'saved 1$' '${WORK_DIR}/saver.log' && break; sleep 0.1; done
  '${TOOL}' load-loop '${state}' ${LOADS}; status=$?
  echo \"saver: $(grep -c saved '${WORK_DIR}/saver.log') saves meanwhile\"
  exit $status"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
message(STATUS "${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "a load beside a re-saving process failed or read a mix (${rc}):\n${out}\n${err}")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
