# `accel merge-weights` on the sharded checkpoints 2 processes saved under zero1, zero2 and fully_sharded
# (dist.gloo.P2.resume_elsewhere_save): the model.safetensors it writes is, byte for byte, the one the same training
# saved in the full format; and on the full checkpoints, the same file again. Then its errors: a directory that holds no checkpoint, a wrong command line.
include(${CMAKE_CURRENT_LIST_DIR}/merged_weights.cmake)
foreach(policy IN ITEMS zero1 zero2 fully_sharded)
  set(full ${CHECKPOINTS}/${policy}<gloo>)
  expect_merged_weights(${CHECKPOINTS}/${policy}<gloo>_sharded ${WORK_DIR}/${policy} ${full}/model.safetensors
                        "${policy}'s sharded checkpoint")
  # A full checkpoint's weights, written again (one tensor at a time): the same bytes.
  expect_merged_weights(${full} ${WORK_DIR}/${policy}-full ${full}/model.safetensors "${policy}'s full checkpoint")
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
