# Two processes save checkpoint after checkpoint into one directory at the same time: each save either completes or
# is refused because the other holds the directory, and what is left there is one whole checkpoint, not a mix.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(state ${WORK_DIR}/state)
execute_process(COMMAND bash -c "'${TOOL}' save-as '${state}' 1 & first=$!; '${TOOL}' save-as '${state}' 2; second=$?; wait $first && exit $second"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 150)
message(STATUS "${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "a save failed otherwise than refused (${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${TOOL} verify ${state} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "after two concurrent savers the checkpoint does not load whole (${rc}):\n${out}\n${err}")
endif()
