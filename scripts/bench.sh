#!/usr/bin/env bash
# Sets up the machine, builds accel's benchmarks (optimised) and runs them, printing their tables.
#   scripts/bench.sh          all benchmarks
#   scripts/bench.sh step     the single-process step overhead (bench/mlp_step.cpp) only
#   scripts/bench.sh range    what a prepared range adds to iterating the plain range (bench/range_overhead.cpp) only
#   scripts/bench.sh ddp      the 2-process data-parallel comparison with PyTorch DDP (bench/ddp_compare.py) only
#   scripts/bench.sh accumulation   all-reduces and time per micro-batch with accumulate<4> on 2 processes only
#   scripts/bench.sh dispatch the loop under accel::dispatch against the same loop on a directly typed accelerator
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ACCEL_BUILD_DIR:-$root/build-bench}
which=${1:-all}

"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCEL_BUILD_TESTS=OFF -DACCEL_BUILD_EXAMPLES=OFF \
  -DACCEL_BUILD_BENCHMARKS=ON
cmake --build "$build" -j2
# One thread everywhere, OpenBLAS included (it reads its own variable when it loads).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

if [[ $which == all || $which == step ]]; then
  "$build/bench/bench_mlp_step"
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
if [[ $which == all || $which == ddp ]]; then
  # Debian's python3-torch lives in the system Python, which may not be the first python3 on PATH.
  python_with_torch=""
  for candidate in /usr/bin/python3 python3; do
    if "$candidate" -c 'import torch' 2>/dev/null; then python_with_torch=$candidate; break; fi
  done
  [[ -n $python_with_torch ]] || { echo "bench: no python3 with torch (install python3-torch)" >&2; exit 1; }
  "$python_with_torch" "$root/bench/ddp_compare.py" "$build/tools/accel" "$build/bench/bench_ddp_step" \
    "$python_with_torch" "${ROUNDS:-5}"
fi
