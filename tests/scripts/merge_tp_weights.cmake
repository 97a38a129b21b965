# `accel merge-weights` on the checkpoints the tensor-parallel jobs saved (mesh.tp.save, fsdp_save, hsdp_save): each
# holds whole weights already (the split ones gathered over tp at save_state, and the tests check them against
# get_state_dict), so the model.safetensors it writes is, byte for byte, the checkpoint's own.
# CHECKPOINTS: the directories' names, separated by commas (a semicolon would not survive the test's command line).
string(REPLACE "," ";" checkpoint_names "${CHECKPOINTS}")
include(${CMAKE_CURRENT_LIST_DIR}/merged_weights.cmake)
foreach(name IN LISTS checkpoint_names)
  expect_merged_weights(${CHECKPOINT_DIR}/${name} ${WORK_DIR}/${name} ${CHECKPOINT_DIR}/${name}/model.safetensors
                        ${name})
endforeach()
