#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh), then builds and runs accel's tests against both supported LibTorch versions:
#  1. LibTorch 2.13 from the PyTorch wheel in .venv/ (the primary one): the whole suite, in $ACCEL_BUILD_DIR
#     (default build/).
#  2. Debian's libtorch-dev 1.13.1: every header compiled (in one translation unit: that each stands alone is the
#     2.13 build's check), the unit tests, and the flat collectives of the sharded policies on 3 Gloo processes
#     (1.13's fallbacks), in $ACCEL_BUILD_DIR-torch1.13. It is built while the 2.13 tests run, at nice 19, and its
#     tests header-only (ACCEL_TESTS_HEADER_ONLY; the 2.13 build's link accel::compiled): the unit tests run in both
#     modes, and this build compiles only the instantiations its tests use.
# Warnings are errors in both (-Wall -Wextra -Wpedantic -Wshadow, cmake/accelDeveloper.cmake). Exits non-zero if
# anything failed in either.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ACCEL_BUILD_DIR:-$root/build}
started=$SECONDS

"$root/scripts/setup.sh" test
# ctest runs two tests at a time on this 2-core machine: one thread each, or LibTorch's OpenMP threads fight for
# the cores (a test then runs several times slower). accel launch does the same for its workers.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
status=0

echo "== LibTorch 2.13 (PyTorch wheel in .venv): the whole suite"
ACCEL_TORCH=pip source "$root/scripts/torch.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCEL_BUILD_TESTS=ON -DACCEL_BUILD_EXAMPLES=ON \
  -DACCEL_WARNINGS_AS_ERRORS=ON -DACCEL_PYTHON="$venv_python" "${torch_cmake_args[@]}"
cmake --build "$build" -j2
echo "-- built, $((SECONDS - started)) s since the start"

# The 1.13 build runs beside the 2.13 tests at nice 19, on the cycles they leave idle (their processes wait on
# each other, on sockets and on Python's imports): the tests keep the cores whenever they want them.
build_torch113() {
  ACCEL_TORCH=debian source "$root/scripts/torch.sh"
  cmake -S "$root" -B "$build$torch_build_suffix" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCEL_BUILD_TESTS=ON \
    -DACCEL_BUILD_EXAMPLES=OFF -DACCEL_TESTS_HEADER_ONLY=ON -DACCEL_WARNINGS_AS_ERRORS=ON \
    -DACCEL_PYTHON="$venv_python" "${torch_cmake_args[@]}" &&
    nice -n 19 cmake --build "$build$torch_build_suffix" -j2 --target accel_tests \
      accel_headers_together accel_flat_collectives accel_cli accel_mesh_tests accel_mesh_groups
}
torch113_log=$(mktemp)
build_torch113 >"$torch113_log" 2>&1 &
torch113_builder=$!
ctest --test-dir "$build" --output-on-failure -j2 || status=1

echo "== LibTorch 1.13.1 (Debian's libtorch-dev): every header, the unit tests, the launcher's tests, the flat collectives, the mesh ($((SECONDS - started)) s so far)"
torch113_built=0
wait "$torch113_builder" && torch113_built=1
cat "$torch113_log"
rm -f "$torch113_log"
echo "-- built, $((SECONDS - started)) s since the start"
ACCEL_TORCH=debian source "$root/scripts/torch.sh"
# mesh.hsdp.*, mesh.tp.* and mesh.3d.* run accel_dist_tests, which this build does not make (the 2.13 build runs
# them; 1.13 could not make its tensor parallelism: a compile error there, no AutocastPrivateUse1 key).
# mesh.python_coordinates checks accel_mesh_layout, which has no LibTorch in it: the 2.13 run is the whole check.
if ((torch113_built)); then
  ctest --test-dir "$build$torch_build_suffix" --output-on-failure -j2 \
    -R '^(unit\.|mesh\.|interop\.launcher\.|dist\.gloo\.P3\.flat_collectives$)' \
    -E '^mesh\.((hsdp|tp|3d)\.|python_coordinates$)' || status=1
else
  echo "scripts/test.sh: the LibTorch 1.13.1 build failed (above)"
  status=1
fi

echo "scripts/test.sh: $((SECONDS - started)) s in all; $([[ $status == 0 ]] && echo "every test passed" || echo FAILED)"
exit $status
