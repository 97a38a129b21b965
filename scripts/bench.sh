#!/usr/bin/env bash
# Sets up the machine, builds accel's benchmarks (optimised) and runs them. Arguments go to each benchmark.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ACCEL_BUILD_DIR:-$root/build-bench}

"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCEL_BUILD_TESTS=OFF -DACCEL_BUILD_EXAMPLES=OFF \
  -DACCEL_BUILD_BENCHMARKS=ON
cmake --build "$build" -j2
# One thread everywhere, OpenBLAS included (it reads its own variable when it loads).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
"$build/bench/bench_mlp_step" "$@"
