#!/usr/bin/env bash
# Sets up the machine, builds accel's benchmarks (optimised) and runs them, printing their tables. LibTorch 2.13
# from .venv by default; ACCEL_TORCH=debian for Debian's 1.13.1 (build directory $ACCEL_BUILD_DIR-torch1.13), whose
# C++ benchmarks then run against the same Python peers (PyTorch 2.13, Accelerate 1.15 from .venv).
#   scripts/bench.sh          all benchmarks
#   scripts/bench.sh compile  compiler CPU time of the README's program and of a bf16 data-parallel loop with accel
#                             (compiled and header-only) against the same programs written with LibTorch alone, and
#                             accel.hpp alone against torch/torch.h alone (bench/compile_times.py; HEADERS=1 adds
#                             each public header alone, CUMULATIVE=1 what each of accel.hpp's headers adds in turn)
#   scripts/bench.sh compile-suite  the same, then a clean build of the test suite with the compiler cache off and
#                             the rebuild after touching include/accel/tracking.hpp
#   scripts/bench.sh step     the single-process step overhead against raw LibTorch (bench/mlp_step.cpp), built
#                             against the compiled part and header-only, only
#   scripts/bench.sh overhead the same, then the flight recorder's cost: the 2-process data-parallel step with the
#                             recorder off and on (bench/recorder_overhead.py)
#   scripts/bench.sh accelerate   accel against Hugging Face Accelerate, 1 process and 2 Gloo processes
#                                 (bench/accelerate_compare.py)
#   scripts/bench.sh ddp      the 2-process data-parallel comparison with PyTorch DDP (bench/ddp_compare.py) only
#   scripts/bench.sh range    what a prepared range adds to iterating the plain range (bench/range_overhead.cpp) only
#   scripts/bench.sh accumulation   all-reduces and time per micro-batch with accumulate<4> on 2 processes only
#   scripts/bench.sh dispatch the loop under accel::dispatch against the same loop on a directly typed accelerator
#   scripts/bench.sh sharded  data_parallel, zero1, zero2, fully_sharded against PyTorch's DDP, ZeroRedundancyOptimizer and FSDP2, AdamW,
#                             2 Gloo processes (bench/sharded_compare.py)
#   scripts/bench.sh mesh     hybrid_sharded on the 2 x 2 mesh against FSDP2's HSDP, 4 Gloo processes, and
#                             tensor_parallel on tp 2 and dp 2 x tp 2 against DTensor's parallelize_module
#                             (bench/mesh_compare.py)
#   scripts/bench.sh cp       context parallelism at cp = 1, 2 and 4 on Gloo (both rotations): tokens per second and
#                             peak activation bytes per process of one causal attention (1k to 16k tokens) and of
#                             char_lm's model, and how much of the ring's exchanges the computation hides
#                             (bench/cp_compare.py)
#   scripts/bench.sh pp       pipeline parallelism's schedules (GPipe, 1F1B, interleaved 1F1B, zero bubble) on pp = 2
#                             Gloo processes: step time against one process, measured bubble against the formula
#                             (bench/pipeline_compare.py; PP_SHAPE=WIDTHxROWS[xLAYERS], PP_STEPS, PP_WARMUP change the jobs)
#   scripts/bench.sh load     loading a 1 GB checkpoint into a 4-process fully_sharded model (its sharded and its full
#                             format) against DCP's load into FSDP2: time and peak resident set (bench/load_compare.py)
#   scripts/bench.sh checkpoint   how long a save of a 315 MB training state stops training: save_state waited for
#                             against an asynchronous one (blocked time, background write, step time while it
#                             writes), one process (bench/checkpoint_save.cpp)
#   scripts/bench.sh comm_hooks   bytes sent and time per step with each gradient communication hook (none, fp16, bf16,
#                             PowerSGD of rank 1 and 4; PowerSGD also with the model in one bucket) at width 1024,
#                             accel against PyTorch's DDP with the same hook, 2 Gloo processes
#                             (bench/comm_hooks_compare.py)
#   scripts/bench.sh data     time per step with 0, 1 and 2 data loader workers against the model step alone, for
#                             a dataset costing 1 ms of CPU per sample (bench/data_pipeline.cpp)
#   scripts/bench.sh soak     20,000 steps and 200 save_state/load_state cycles on 2 Gloo processes, each process's
#                             resident set sampled every second (bench/soak.cpp)
#   scripts/bench.sh cluster  2 machines x 2 processes of the namespace cluster (root only; skipped otherwise): bytes
#                             per step across the machines' link for data_parallel, zero2, fully_sharded and
#                             hybrid_sharded against Gloo's formula, and ms per step on 1 Gbit/s and 100 Mbit/s links
#                             against PyTorch's DDP and FSDP2 under torchrun (bench/cluster_links.py)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
which=${1:-all}

"$root/scripts/setup.sh" test
source "$root/scripts/torch.sh"
build=${ACCEL_BUILD_DIR:-$root/build-bench}$torch_build_suffix
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCEL_BUILD_TESTS=OFF -DACCEL_BUILD_EXAMPLES=OFF \
  -DACCEL_BUILD_BENCHMARKS=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "${torch_cmake_args[@]}"
if [[ $which == compile || $which == compile-suite ]]; then
  # The compile-time benchmark times compile commands itself; it builds its programs only to keep them correct.
  cmake --build "$build" -j2 --target bench_compile_readme bench_compile_readme_header_only bench_compile_readme_torch \
    bench_compile_dp bench_compile_dp_header_only bench_compile_dp_torch
else
  cmake --build "$build" -j2
fi
# One thread everywhere, OpenBLAS included (it reads its own variable when it loads).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
echo "LibTorch: $(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")"
echo "Python peers: $("$venv_python" -c 'import torch, accelerate; print("torch", torch.__version__, "accelerate", accelerate.__version__)')"

if [[ $which == compile || $which == compile-suite ]]; then
  # Compiler CPU time of a user's file: accel against LibTorch alone, paired rounds (bench/compile_times.py).
  extra=()
  [[ $which == compile-suite ]] && extra=(--suite "$root")
  "$venv_python" "$root/bench/compile_times.py" "$build" "${ROUNDS:-5}" ${HEADERS:+--headers} ${CUMULATIVE:+--cumulative} \
    "${extra[@]}"
  exit 0
fi
if [[ $which == all || $which == step || $which == overhead ]]; then
  echo "== compiled (accel::compiled)"
  "$build/bench/bench_mlp_step"
  echo "== header-only (accel::accel)"
  "$build/bench/bench_mlp_step_header_only"
fi
if [[ $which == all || $which == overhead ]]; then
  "$venv_python" "$root/bench/recorder_overhead.py" "$build/tools/accel" "$build/bench/bench_ddp_step" "${ROUNDS:-7}"
fi
if [[ $which == all || $which == accelerate ]]; then
  "$venv_python" "$root/bench/accelerate_compare.py" "$build/tools/accel" "$build/bench/bench_tiny_step" \
    "$venv_python" "${ROUNDS:-7}"
fi
if [[ $which == all || $which == dispatch ]]; then
  "$build/bench/bench_dispatch"
fi
if [[ $which == all || $which == range ]]; then
  "$build/bench/bench_range_overhead"
fi
if [[ $which == all || $which == accumulation ]]; then
  "$build/tools/accel" launch --nproc_per_node 2 --master_port 0 "$build/bench/bench_accumulation"
fi
if [[ $which == all || $which == sharded ]]; then
  "$venv_python" "$root/bench/sharded_compare.py" "$build/tools/accel" "$build/bench/bench_sharded_step" \
    "$venv_python" "${ROUNDS:-5}"
fi
if [[ $which == all || $which == mesh ]]; then
  "$venv_python" "$root/bench/mesh_compare.py" "$build/tools/accel" "$build/bench/bench_mesh_step" "$venv_python" \
    "${ROUNDS:-5}"
fi
if [[ $which == all || $which == cp ]]; then
  "$venv_python" "$root/bench/cp_compare.py" "$build/tools/accel" "$build/bench/bench_cp_step" "${ROUNDS:-3}"
fi
if [[ $which == all || $which == pp ]]; then
  "$venv_python" "$root/bench/pipeline_compare.py" "$build/tools/accel" "$build/bench/bench_pipeline_step" \
    "${ROUNDS:-3}"
fi
if [[ $which == all || $which == load ]]; then
  "$venv_python" "$root/bench/load_compare.py" "$build/tools/accel" "$build/bench/bench_checkpoint_load" \
    "$venv_python" "${ROUNDS:-3}"
fi
if [[ $which == all || $which == checkpoint ]]; then
  "$build/bench/bench_checkpoint_save" "${CHECKPOINT_DIR:-$build/bench-checkpoints}" "${ROUNDS:-5}"
fi
if [[ $which == all || $which == ddp ]]; then
  "$venv_python" "$root/bench/ddp_compare.py" "$build/tools/accel" "$build/bench/bench_ddp_step" "$venv_python" \
    "${ROUNDS:-5}"
fi
if [[ $which == all || $which == comm_hooks ]]; then
  "$venv_python" "$root/bench/comm_hooks_compare.py" "$build/tools/accel" "$build/bench/bench_comm_hook_step" \
    "$venv_python" "${ROUNDS:-5}"
fi
if [[ $which == all || $which == data ]]; then
  "$build/bench/bench_data_pipeline" "${ROUNDS:-15}"
fi
if [[ $which == all || $which == soak ]]; then
  "$build/tools/accel" launch --nproc_per_node 2 --master_port 0 "$build/bench/bench_soak" "${SOAK_STEPS:-20000}" 100
fi
if [[ $which == all || $which == cluster ]]; then
  status=0
  "$venv_python" "$root/bench/cluster_links.py" "$build/tools/accel" "$build/bench/bench_cluster_step" \
    "$venv_python" "${ROUNDS:-3}" || status=$?
  # 77: not root, said why; 1: accel's bytes differ from the formula, said which (a finding, not a crash).
  [[ $status == 0 || $status == 77 || $status == 1 ]] || exit $status
fi
