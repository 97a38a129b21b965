# safetensors files cross between accel and Python's torch 2.13 (tests/scripts/checkpoint_interop.py says what each step
# checks): accel's file read exactly in Python, Python's state dict loaded into LibTorch by name and saved back.
set(dir ${WORK_DIR})
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
foreach(step IN ITEMS "${TOOL};write;${dir}/accel.safetensors" "${PYTHON};${SCRIPT};check;${dir}/accel.safetensors"
                      "${PYTHON};${SCRIPT};write;${dir}" "${TOOL};check;${dir}" "${PYTHON};${SCRIPT};verify;${dir}")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${step}: ${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${step}\n${out}\n${err}")
  endif()
endforeach()
