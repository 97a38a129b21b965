# `accel merge-weights` on the sharded checkpoints 2 processes saved under zero1, zero2 and fully_sharded
# (dist.gloo.P2.resume_elsewhere_save): the model.safetensors it writes is, byte for byte, the one the same training
# saved in the full format; and on the full checkpoints, the same file again. Then its errors: a directory that holds no checkpoint, a wrong command line.
foreach(policy IN ITEMS zero1 zero2 fully_sharded)
  set(out ${WORK_DIR}/${policy})
  file(REMOVE_RECURSE ${out})
  execute_process(COMMAND ${LAUNCHER} merge-weights ${CHECKPOINTS}/${policy}<gloo>_sharded ${out}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr TIMEOUT 120)
  if(NOT rc EQUAL 0 OR NOT stdout MATCHES "wrote .*model.safetensors")
    message(FATAL_ERROR "accel merge-weights failed on ${policy}'s sharded checkpoint (${rc}):\n${stdout}\n${stderr}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${out}/model.safetensors
                          ${CHECKPOINTS}/${policy}<gloo>/model.safetensors RESULT_VARIABLE different)
  if(different)
    message(FATAL_ERROR "${policy}: the merged weights differ from the full checkpoint's model.safetensors")
  endif()
  message(STATUS "${policy}: merged, equal to the full checkpoint's model.safetensors")
  # A full checkpoint's weights, written again (one tensor at a time): the same bytes.
  file(REMOVE_RECURSE ${out}-full)
  execute_process(COMMAND ${LAUNCHER} merge-weights ${CHECKPOINTS}/${policy}<gloo> ${out}-full
                  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr TIMEOUT 120)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${out}-full/model.safetensors
                          ${CHECKPOINTS}/${policy}<gloo>/model.safetensors RESULT_VARIABLE different)
  if(NOT rc EQUAL 0 OR different)
    message(FATAL_ERROR "${policy}: merge-weights of the full checkpoint (${rc}) differs from its model.safetensors:\n"
                        "${stdout}\n${stderr}")
  endif()
endforeach()
execute_process(COMMAND ${LAUNCHER} merge-weights ${WORK_DIR}/nothing-here ${WORK_DIR}/out
                RESULT_VARIABLE rc ERROR_VARIABLE stderr TIMEOUT 120)
if(rc EQUAL 0 OR NOT stderr MATCHES "no checkpoint at .*nothing-here")
  message(FATAL_ERROR "merge-weights on a directory without a checkpoint: expected an error naming it, got ${rc}: "
                      "${stderr}")
endif()
execute_process(COMMAND ${LAUNCHER} merge-weights only-one RESULT_VARIABLE rc ERROR_VARIABLE stderr TIMEOUT 60)
if(NOT rc EQUAL 2 OR NOT stderr MATCHES "expected a checkpoint directory and an output directory")
  message(FATAL_ERROR "merge-weights with one argument: expected exit code 2 and the usage, got ${rc}: ${stderr}")
endif()
