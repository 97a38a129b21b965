# Trains the character-level language model in two parts, as a user who stops and restarts it: 50 steps, then a
# second run to 100 steps in the same output directory, which must resume from step 50's checkpoint. A third run
# trains 100 steps without a break and must end with the same losses and the same sample, so that resuming lost
# nothing (weights, optimizer, data position, random generator). Checkpoints every 25 steps, the last 2 kept. Last,
# two steps in bf16 (ACCELERATE_MIXED_PRECISION=bf16, which accel::dispatch reads; bfloat16 matrix products are ten
# times slower than float32's on a CPU without AVX-512 BF16, such as CI's AMD EPYC).
file(REMOVE_RECURSE ${WORK_DIR})

# ACCELERATE_MIXED_PRECISION chooses the precision: `no` (fp32) or `bf16`.
function(run_char_lm name steps precision)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ACCELERATE_MIXED_PRECISION=${precision}
                          ${PROGRAM} --steps ${steps} --save-every 25 --out ${WORK_DIR}/${name}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  message("--- ACCELERATE_MIXED_PRECISION=${precision} char_lm --steps ${steps} --out ${name}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "char_lm --steps ${steps} exited with ${rc}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

function(expect text what)
  string(FIND "${out}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "char_lm did not print `${text}`: ${what}")
  endif()
endfunction()
function(expect_not text what)
  string(FIND "${out}" "${text}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "char_lm printed `${text}`: ${what}")
  endif()
endfunction()

# What follows "final loss" (the losses and the sample), checked to be there.
function(final_part result)
  string(FIND "${out}" "final loss: train = " at)
  if(at EQUAL -1)
    message(FATAL_ERROR "char_lm did not print `final loss: train = T validation = V`")
  endif()
  string(SUBSTRING "${out}" ${at} -1 final)
  set(${result} "${final}" PARENT_SCOPE)
endfunction()

# First part: a fresh start that stops after 50 steps.
run_char_lm(run 50 no)
expect("different characters, fp32\n" "ACCELERATE_MIXED_PRECISION=no trains in fp32")
expect("initial validation loss = " "a fresh start measures the untrained model")
expect_not("resumed from step" "the output directory was empty")
expect("step 50 validation loss = " "the last step is saved")

# Second part: resumes from step 50 and ends at 100.
run_char_lm(run 100 no)
expect("resumed from step 50\n" "the second run must resume from the first run's last checkpoint")
expect_not("initial validation loss" "a resumed run does not start afresh")
expect_not("step 50 " "a resumed run does not redo the steps already done")
expect("step 75 validation loss = " "")
expect("step 100 validation loss = " "the run ends at --steps")
final_part(resumed)
if(NOT resumed MATCHES "^final loss: train = ([0-9.]+) validation = ([0-9.]+)\nsample:\n(Shall I compare thee[^\n]*\n?[^\n]*)")
  message(FATAL_ERROR "char_lm did not print the final losses, then `sample:` and text after the prompt")
endif()
set(train_loss ${CMAKE_MATCH_1})
set(validation_loss ${CMAKE_MATCH_2})
string(LENGTH "${CMAKE_MATCH_3}" sample_length)
if(sample_length LESS 40)
  message(FATAL_ERROR "the generated sample is too short: `${CMAKE_MATCH_3}`")
endif()
# Untrained, the loss is 4.3 nats per character; after 100 steps, 2.33 on both parts of the text (measured).
if(validation_loss GREATER_EQUAL 2.5 OR train_loss GREATER_EQUAL 2.5)
  message(FATAL_ERROR "char_lm did not learn: final loss train ${train_loss}, validation ${validation_loss} (want < 2.5)")
endif()
file(GLOB checkpoints RELATIVE ${WORK_DIR}/run/checkpoints ${WORK_DIR}/run/checkpoints/*)
list(SORT checkpoints)
if(NOT checkpoints STREQUAL "checkpoint_2;checkpoint_3")
  message(FATAL_ERROR "after 4 saves with total_limit 2, the checkpoints are `${checkpoints}`, not checkpoint_2;checkpoint_3")
endif()

# Without a break: the same end.
run_char_lm(straight 100 no)
final_part(straight)
if(NOT resumed STREQUAL straight)
  message(FATAL_ERROR "resumed training ended differently from training without a break:\n${resumed}\nvs\n${straight}")
endif()
# bf16, as dispatch chooses it: two steps.
run_char_lm(bf16 2 bf16)
expect("different characters, bf16\n" "ACCELERATE_MIXED_PRECISION=bf16 trains in bf16")
final_part(bf16_end)

message("resumed from step 50 and ended as training without a break: train loss ${train_loss}, validation loss ${validation_loss}")
