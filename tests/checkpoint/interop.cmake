# accel writes a safetensors file that Python (numpy + standard library) reads with the exact values, and reads
# one that Python wrote.
set(dir ${WORK_DIR})
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
foreach(step IN ITEMS "${TOOL};write;${dir}/accel.safetensors" "${PYTHON};${SCRIPT};check;${dir}/accel.safetensors"
                      "${PYTHON};${SCRIPT};write;${dir}/python.safetensors" "${TOOL};check;${dir}/python.safetensors")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${step}: ${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${step}\n${out}\n${err}")
  endif()
endforeach()
