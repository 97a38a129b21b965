# expect_merged_weights(CHECKPOINT OUT EXPECTED WHAT): `accel merge-weights CHECKPOINT OUT` (LAUNCHER is accel) succeeds,
# says it wrote model.safetensors, and writes OUT/model.safetensors equal, byte for byte, to EXPECTED; WHAT names the
# case in a failure. Shared by merge_weights.cmake and merge_tp_weights.cmake.
function(expect_merged_weights checkpoint out expected what)
  file(REMOVE_RECURSE ${out})
  execute_process(COMMAND ${LAUNCHER} merge-weights ${checkpoint} ${out}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr TIMEOUT 120)
  if(NOT rc EQUAL 0 OR NOT stdout MATCHES "wrote .*model.safetensors")
    message(FATAL_ERROR "accel merge-weights failed on ${what} (${rc}):\n${stdout}\n${stderr}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${out}/model.safetensors ${expected}
                  RESULT_VARIABLE different)
  if(different)
    message(FATAL_ERROR "${what}: the merged weights differ from ${expected}")
  endif()
  message(STATUS "${what}: merged, equal to ${expected}")
endfunction()
