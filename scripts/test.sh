#!/usr/bin/env bash
# Sets up the machine (Debian packages), builds accel's test suite and runs all of it. Exits non-zero on any
# failure. Build directory: $ACCEL_BUILD_DIR, default build/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ACCEL_BUILD_DIR:-$root/build}

"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCEL_BUILD_TESTS=ON -DACCEL_BUILD_EXAMPLES=ON
cmake --build "$build" -j2
ctest --test-dir "$build" --output-on-failure -j2
