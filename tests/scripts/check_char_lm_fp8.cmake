# fp8.char_lm_vs_bf16: the character-level transformer of examples/char_lm.cpp trained 200 steps with bf16 and with
# fp8 (ACCELERATE_MIXED_PRECISION, through accel::dispatch: torchao's tensorwise recipe, the Linear layers inside the
# blocks in float8): fp8's final train and validation losses must be within 5% of bf16's.
file(REMOVE_RECURSE ${WORK_DIR})

function(final_losses precision train validation)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ACCELERATE_MIXED_PRECISION=${precision}
                          ${PROGRAM} --steps 200 --save-every 200 --out ${WORK_DIR}/${precision}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  message("--- ACCELERATE_MIXED_PRECISION=${precision} char_lm --steps 200\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "char_lm with ${precision} exited with ${rc}")
  endif()
  if(NOT out MATCHES "different characters, ${EXPECTED_${precision}}\n")
    message(FATAL_ERROR "ACCELERATE_MIXED_PRECISION=${precision} did not train with ${EXPECTED_${precision}}")
  endif()
  if(NOT out MATCHES "final loss: train = ([0-9.]+) validation = ([0-9.]+)\n")
    message(FATAL_ERROR "char_lm with ${precision} did not print its final losses")
  endif()
  set(${train} ${CMAKE_MATCH_1} PARENT_SCOPE)
  set(${validation} ${CMAKE_MATCH_2} PARENT_SCOPE)
endfunction()

set(EXPECTED_bf16 "bf16")
set(EXPECTED_fp8 "fp8<tensorwise_scaling>")
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
  message("${part} loss after 200 steps: bf16 ${bf16_${part}}, fp8 ${fp8_${part}} (apart by ${difference}, allowed ${allowed} thousandths)")
  if(difference GREATER allowed)
    message(FATAL_ERROR "fp8's final ${part} loss ${fp8_${part}} is not within 5% of bf16's ${bf16_${part}}")
  endif()
endforeach()
