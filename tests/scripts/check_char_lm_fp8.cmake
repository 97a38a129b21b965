# fp8.char_lm_vs_bf16: the character-level transformer of examples/char_lm.cpp trained 100 steps with bf16 and with
# fp8 (ACCELERATE_MIXED_PRECISION, through accel::dispatch: torchao's tensorwise recipe, the Linear layers inside the
# blocks in float8): fp8's final train and validation losses must be within 5% of bf16's, and each training must
# have learnt: its final validation loss at most 60% of its initial one, so that two trainings that both went
# nowhere do not pass as equal. Measured: 4.30 untrained; 2.33 after 100 steps, 2.22 after 150, 1.94 after 300,
# bf16 and fp8 within 0.002 of each other at each. 100 steps (2.33 is 54% of 4.30), not the 300 this once ran,
# because bf16 matrix products are slow on a CPU without AVX-512 BF16 (CI's): about 1 s a step alone there.
#   -DSTEP=train -DPRECISION=bf16|fp8: one training, its output kept in ${WORK_DIR}/${PRECISION}.out (the two run
#   side by side as the fixture fp8.char_lm.${PRECISION}); -DSTEP=compare: the two final losses compared.
set(steps 100)
set(EXPECTED_bf16 "bf16")
set(EXPECTED_fp8 "fp8<tensorwise_scaling>")

if(STEP STREQUAL "train")
  file(REMOVE_RECURSE ${WORK_DIR}/${PRECISION} ${WORK_DIR}/${PRECISION}.out)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ACCELERATE_MIXED_PRECISION=${PRECISION}
                          ${PROGRAM} --steps ${steps} --save-every ${steps} --out ${WORK_DIR}/${PRECISION}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  message("--- ACCELERATE_MIXED_PRECISION=${PRECISION} char_lm --steps ${steps}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "char_lm with ${PRECISION} exited with ${rc}")
  endif()
  if(NOT out MATCHES "different characters, ${EXPECTED_${PRECISION}}\n")
    message(FATAL_ERROR "ACCELERATE_MIXED_PRECISION=${PRECISION} did not train with ${EXPECTED_${PRECISION}}")
  endif()
  file(WRITE ${WORK_DIR}/${PRECISION}.out "${out}")
  return()
endif()

function(final_losses precision train validation)
  if(NOT EXISTS ${WORK_DIR}/${precision}.out)
    message(FATAL_ERROR "no output of the ${precision} training (the test fp8.char_lm.${precision} runs it)")
  endif()
  file(READ ${WORK_DIR}/${precision}.out out)
  if(NOT out MATCHES "final loss: train = ([0-9.]+) validation = ([0-9.]+)\n")
    message(FATAL_ERROR "char_lm with ${precision} did not print its final losses")
  endif()
  set(${train} ${CMAKE_MATCH_1} PARENT_SCOPE)
  set(${validation} ${CMAKE_MATCH_2} PARENT_SCOPE)
  set(final ${CMAKE_MATCH_2})
  if(NOT out MATCHES "initial validation loss = ([0-9.]+)\n")
    message(FATAL_ERROR "char_lm with ${precision} did not print its initial validation loss")
  endif()
  # Learnt: the final validation loss at most 60% of the initial one (in thousandths: CMake has no floating point).
  string(REPLACE "." "" initial_milli ${CMAKE_MATCH_1})
  string(REPLACE "." "" final_milli ${final})
  math(EXPR initial_six_tenths "(${initial_milli} + 0) * 6 / 10")
  math(EXPR final_milli "${final_milli} + 0")
  if(final_milli LESS_EQUAL initial_six_tenths)
    message("${precision}: validation loss ${CMAKE_MATCH_1} before training, ${final} after ${steps} steps")
  else()
    message(FATAL_ERROR "char_lm with ${precision} did not learn: validation loss ${CMAKE_MATCH_1} before training, "
                        "${final} after ${steps} steps (want at most 60% of the first)")
  endif()
endfunction()

final_losses(bf16 bf16_train bf16_validation)
final_losses(fp8 fp8_train fp8_validation)
# CMake has no floating point: compare in thousandths (the losses are printed with 3 decimals).
foreach(part IN ITEMS train validation)
  string(REPLACE "." "" bf16_milli ${bf16_${part}})
  string(REPLACE "." "" fp8_milli ${fp8_${part}})
  math(EXPR bf16_milli "${bf16_milli} + 0")  # drops leading zeros
  math(EXPR fp8_milli "${fp8_milli} + 0")
  math(EXPR difference "${fp8_milli} - ${bf16_milli}")
  if(difference LESS 0)
    math(EXPR difference "-${difference}")
  endif()
  math(EXPR allowed "${bf16_milli} * 5 / 100")
  message("${part} loss after ${steps} steps: bf16 ${bf16_${part}}, fp8 ${fp8_${part}} (apart by ${difference}, allowed ${allowed} thousandths)")
  if(difference GREATER allowed)
    message(FATAL_ERROR "fp8's final ${part} loss ${fp8_${part}} is not within 5% of bf16's ${bf16_${part}}")
  endif()
endforeach()
