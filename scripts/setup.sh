#!/usr/bin/env bash
# Installs everything accel needs from Debian's packages. Idempotent: a second run installs nothing.
# Run as root, or as a user with sudo.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache lld pkg-config
  libtorch-dev libgloo-dev librange-v3-dev catch2
  libopenblas0-pthread          # without it Debian's LibTorch uses the reference BLAS (~10x slower)
  python3 python3-numpy
  python3-torch                 # PyTorch 1.13: the reference for the DDP benchmark, and torchrun
  openmpi-bin                   # mpirun, to test that accel programs start under Open MPI
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all packages present"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: run as root or install sudo (missing: ${missing[*]})" >&2; exit 1; }
  sudo_cmd=(sudo)
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
