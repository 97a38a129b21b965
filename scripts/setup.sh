#!/usr/bin/env bash
# Installs what one of accel's scripts needs; idempotent (a second run installs nothing). Run as root, or as a user
# with sudo.
#   scripts/setup.sh example   what scripts/example.sh needs: the toolchain, range-v3, Gloo's headers, and .venv/ with
#                              PyTorch 2.13 (requirements/example.txt), whose wheel carries LibTorch 2.13
#   scripts/setup.sh docs      what scripts/docs.sh needs: .venv/ with MkDocs (requirements/docs.txt)
#   scripts/setup.sh [test]    what scripts/test.sh and scripts/bench.sh need: all of the above, Catch2, Debian's LibTorch
#                              1.13.1 (the second supported LibTorch), Open MPI, and in .venv/ the Python peers the tests
#                              compare against (requirements/test.txt)
# .venv/ is the build's own virtual environment, never the system Python. Installs add to it: `rm -rf .venv` starts
# afresh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

profile=${1:-test}
example_packages=(
  build-essential cmake ninja-build librange-v3-dev python3 python3-venv
  libgloo-dev                   # gloo/*.h for c10d's ProcessGroupGloo.hpp (headers only: Gloo's code is in libtorch_cpu)
)
case "$profile" in
  example) packages=("${example_packages[@]}") ;;
  docs) packages=(python3 python3-venv) ;;
  test)
    packages=(
      "${example_packages[@]}" ccache lld pkg-config catch2
      libtorch-dev                  # LibTorch 1.13.1: the second supported configuration
      libopenblas0-pthread          # without it Debian's LibTorch uses the reference BLAS (~10x slower)
      openmpi-bin                   # mpirun, to test that accel programs start under Open MPI
      strace                        # checkpoint.synced_save: which files and directories a save syncs
      iproute2                      # ip and tc: the cluster.* tests' machines (tests/scripts/cluster.py; util-linux's
                                    # unshare, nsenter and setpriv are in every Debian, being essential)
    )
    ;;
  *)
    echo "usage: scripts/setup.sh [example | docs | test]" >&2
    exit 2
    ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "setup: Debian packages present"
else
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: run as root or install sudo (missing: ${missing[*]})" >&2; exit 1; }
    sudo_cmd=(sudo)
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The virtual environment: a profile's requirements are installed when its files changed since it was last set up
# (a copy of them inside .venv says what is installed).
venv=$root/.venv
installed=$venv/accel-requirements-$profile.txt
file=$root/requirements/$profile.txt
# A requirements file with the files it includes (`-r NAME`, beside it), in order.
requirements_text() {
  cat "$1"
  sed -n 's/^-r //p' "$1" | while read -r included; do requirements_text "$(dirname "$1")/$included"; done
}
wanted=$(requirements_text "$file")
if [[ -f $installed && $(cat "$installed") == "$wanted" ]]; then
  echo "setup: .venv up to date for $profile"
  exit 0
fi
python=${ACCEL_SETUP_PYTHON:-python3}
if ! "$venv/bin/python" -c '' 2>/dev/null; then
  echo "setup: making .venv with $("$python" --version)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
fi
echo "setup: installing requirements/$profile.txt into .venv"
# With uv (installed into .venv from PyPI by pip), which fetches and unpacks the wheels in parallel: about 35 s against
# pip's 185 s on a 2-core machine (nothing cached), the same versions. uv reads neither pip.conf nor PIP_* variables:
# the indexes, wheel directories and constraints this machine's pip is told to use are passed to it, and, as pip
# does, the newest version in any of them is taken (unsafe-best-match; uv's default takes the first index's). It does
# not compile every module to bytecode as pip does (most are never imported): Python does so at the first import.
# Where uv cannot be installed, pip installs the requirements itself.
if "$venv/bin/uv" --version >/dev/null 2>&1 || "$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv; then
  uv_args=(--index-strategy unsafe-best-match)
  while IFS= read -r setting; do  # scope.key='value', the values of list settings separated by spaces
    key=${setting%%=*} value=${setting#*=}
    value=${value#\'} value=${value%\'}
    case ${key##*.} in
      index-url) uv_args+=(--index-url "$value") ;;
      extra-index-url) for v in $value; do uv_args+=(--extra-index-url "$v"); done ;;
      find-links) for v in $value; do uv_args+=(--find-links "$v"); done ;;
      constraint) for v in $value; do uv_args+=(--constraint "$v"); done ;;
      no-index) if [[ $value =~ ^(1|[Tt]rue|yes|on)$ ]]; then uv_args+=(--no-index); fi ;;
      cert) export SSL_CERT_FILE=$value ;;
      default-timeout | timeout) export UV_HTTP_TIMEOUT=${value%.*} ;;
    esac
  done < <("$venv/bin/python" -m pip config list 2>/dev/null)
  if ! "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" "${uv_args[@]}" -r "$file"; then
    echo "setup: uv could not install requirements/$profile.txt (above); pip installs it"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$file"
  fi
else
  echo "setup: uv could not be installed; pip installs requirements/$profile.txt"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$file"
fi
if [[ $profile != docs ]]; then
  "$venv/bin/python" -c 'import torch; assert torch.distributed.is_gloo_available(), "this torch has no Gloo"'
fi
printf '%s' "$wanted" >"$installed"
