# `accel merge-weights` on the checkpoints the tensor-parallel jobs saved (mesh.tp.save, fsdp_save, hsdp_save): each
# holds whole weights already (the split ones gathered over tp at save_state, and the tests check them against
# get_state_dict), so the model.safetensors it writes is, byte for byte, the checkpoint's own.
# CHECKPOINTS: the directories' names, separated by commas (a semicolon would not survive the test's command line).
string(REPLACE "," ";" checkpoint_names "${CHECKPOINTS}")
foreach(name IN LISTS checkpoint_names)
  set(out ${WORK_DIR}/${name})
  file(REMOVE_RECURSE ${out})
  execute_process(COMMAND ${LAUNCHER} merge-weights ${CHECKPOINT_DIR}/${name} ${out}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr TIMEOUT 120)
  if(NOT rc EQUAL 0 OR NOT stdout MATCHES "wrote .*model.safetensors")
    message(FATAL_ERROR "accel merge-weights failed on ${name} (${rc}):\n${stdout}\n${stderr}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${out}/model.safetensors
                          ${CHECKPOINT_DIR}/${name}/model.safetensors RESULT_VARIABLE different)
  if(different)
    message(FATAL_ERROR "${name}: the merged weights differ from the checkpoint's model.safetensors")
  endif()
  message(STATUS "${name}: merged, equal to the checkpoint's whole weights")
endforeach()
