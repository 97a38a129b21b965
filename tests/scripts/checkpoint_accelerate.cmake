# Training state crossing between Accelerate 1.15 and accel (tests/scripts/checkpoint_accelerate.py says what each step
# checks). DIRECTION python_to_cpp: Python trains N steps, saves with Accelerate, trains M more; accel loads that
# checkpoint and trains the same M; both end equal. cpp_to_python: the reverse, accel saving Accelerate's files. Each
# both with the model in model.safetensors and in pytorch_model.bin (safe_serialization off).
# merge_weights: 2 processes save a sharded checkpoint under zero2, accel merge-weights merges it, and Accelerate's
# load_checkpoint_in_model loads the result into the Python model, whose outputs equal accel's; merged again with
# Accelerate's --unsafe_serialization and --remove_checkpoint_dir: pytorch_model.bin, loaded the same, the checkpoint
# removed.
set(dir ${WORK_DIR})
set(n 7)
set(m 5)
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
if(DIRECTION STREQUAL "python_to_cpp")
  set(steps "${PYTHON}|${SCRIPT}|data|${dir}|${n}|${m}" "${PYTHON}|${SCRIPT}|python-first|${dir}|${n}|${m}"
            "${TOOL}|continue|${dir}|${n}|${m}|python_checkpoint"
            "${TOOL}|continue|${dir}|${n}|${m}|python_checkpoint_bin"
            "${PYTHON}|${SCRIPT}|compare|${dir}|accel_continued_python_checkpoint|python_after"
            "${PYTHON}|${SCRIPT}|compare|${dir}|accel_continued_python_checkpoint_bin|python_after")
elseif(DIRECTION STREQUAL "merge_weights")
  set(steps "${PYTHON}|${SCRIPT}|data|${dir}|${n}|${m}"
            "${LAUNCHER}|launch|--nproc_per_node|2|--master_port|0|${TOOL}|sharded|${dir}|${n}"
            "${LAUNCHER}|merge-weights|${dir}/sharded|${dir}/merged" "${PYTHON}|${SCRIPT}|merged|${dir}"
            "${LAUNCHER}|merge-weights|--unsafe_serialization|--remove-checkpoint-dir|${dir}/sharded|${dir}/merged_bin"
            "${PYTHON}|${SCRIPT}|merged|${dir}|merged_bin")
else()
  set(steps "${PYTHON}|${SCRIPT}|data|${dir}|${n}|${m}" "${TOOL}|train|${dir}|${n}|${m}"
            "${PYTHON}|${SCRIPT}|python-continue|${dir}|${n}|${m}|accel_checkpoint"
            "${PYTHON}|${SCRIPT}|python-continue|${dir}|${n}|${m}|accel_checkpoint_bin"
            "${PYTHON}|${SCRIPT}|compare|${dir}|python_continued_accel_checkpoint|accel_after"
            "${PYTHON}|${SCRIPT}|compare|${dir}|python_continued_accel_checkpoint_bin|accel_after")
endif()
foreach(step IN LISTS steps)
  string(REPLACE "|" ";" step "${step}")  # each step's words are |-separated, so that steps stay one item each
  execute_process(COMMAND ${step} TIMEOUT 120 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${step}: ${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${step}\n${out}\n${err}")
  endif()
endforeach()
