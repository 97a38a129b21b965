#!/usr/bin/env bash
# Sets up the machine (Debian packages), builds the main example (linear regression with accel) and runs it.
# Build directory: $ACCEL_BUILD_DIR, default build-example/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ACCEL_BUILD_DIR:-$root/build-example}

"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCEL_BUILD_TESTS=OFF -DACCEL_BUILD_EXAMPLES=ON
cmake --build "$build" -j2 --target linear_regression
"$build/examples/linear_regression"
