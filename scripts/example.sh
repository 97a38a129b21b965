#!/usr/bin/env bash
# Sets up what the examples need (scripts/setup.sh example: the toolchain and PyTorch's wheel, nothing the tests need),
# builds an example against LibTorch 2.13 and runs it:
#   scripts/example.sh              linear regression with accel (prints the learned weight and bias)
#   scripts/example.sh classifier   spiral classifier: bf16, gradient accumulation, 2 processes under `accel launch`
#   scripts/example.sh char_lm      character-level transformer on Shakespeare's sonnets, with checkpoints
# Build directory: $ACCEL_BUILD_DIR, default build-example/ (build-example-torch1.13/ with ACCEL_TORCH=debian).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ACCEL_BUILD_DIR:-$root/build-example}
example=${1:-linear_regression}
case "$example" in
  linear_regression | classifier | char_lm) ;;
  *)
    echo "usage: scripts/example.sh [linear_regression | classifier | char_lm]" >&2
    exit 2
    ;;
esac

# Debian's LibTorch 1.13.1 (ACCEL_TORCH=debian) comes with the tests' set-up.
"$root/scripts/setup.sh" "$([[ ${ACCEL_TORCH:-pip} == debian ]] && echo test || echo example)"
source "$root/scripts/torch.sh"  # LibTorch 2.13 from .venv; ACCEL_TORCH=debian for Debian's 1.13.1
build=$build$torch_build_suffix
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCEL_BUILD_TESTS=OFF -DACCEL_BUILD_EXAMPLES=ON \
  "${torch_cmake_args[@]}"
case "$example" in
  linear_regression)
    cmake --build "$build" -j2 --target linear_regression
    "$build/examples/linear_regression"
    ;;
  classifier)
    # The launcher, `accel`, starts the 2 processes of the data-parallel job.
    cmake --build "$build" -j2 --target classifier accel_cli
    "$build/tools/accel" launch --nproc_per_node 2 "$build/examples/classifier"
    ;;
  char_lm)
    # A fresh run each time: the program would otherwise resume from the checkpoints of the previous one. To see
    # it resume, run it again yourself: build-example/examples/char_lm --out build-example/char_lm-run --steps 1200
    cmake --build "$build" -j2 --target char_lm
    rm -rf "$build/char_lm-run"
    "$build/examples/char_lm" --out "$build/char_lm-run"
    ;;
esac
