#!/usr/bin/env bash
# accel on a GPU machine in one command (issue 38; docs/gpu.md gives the device tool's call and what to read after).
#   scripts/gpu.sh --prepare-carry   here, on the CPU machine, before a device run: fills .gpu-carry/ (ignored by
#                                    git) with what the GPU machine lacks: range-v3, Catch2 v2 and Gloo's headers and
#                                    CMake packages, and the clang-format wheel; the device run names .gpu-carry
#   scripts/gpu.sh                   on the GPU machine: builds accel's tests, examples and benchmarks against that
#                                    machine's LibTorch (python3's torch) and NCCL (its nvidia-nccl wheel) on every
#                                    core, then runs the NCCL checks, fp16/bf16 training against torch.autocast +
#                                    GradScaler, the CUDA generator resume, multi_tensor_adamw against LibTorch's
#                                    AdamW, fp8 (against the Python recipe, and its speed against bf16), the
#                                    benchmarks and the test suite; logs
#                                    and summary.txt in $OUT
#   scripts/gpu.sh --dry-run         here: the same code paths on the CPU (build-gpu/, nice -n 10, -j2); what needs
#                                    CUDA says "skipped: no GPU"; logs in build-gpu/out
# Options: --only PHASES   comma-separated among build, nccl, autocast, resume, adamw, fp8, bench, suite (default: all); the
#                          build is limited to what the phases need
#          --budget S      seconds for the whole run (GPU default 520, dry run unlimited): a phase that no longer
#                          fits is skipped and says so, and the suite stops in time
# Environment: ACCEL_GPU_PYTHON (default: python3 on the GPU, .venv's here), ACCEL_GPU_SUITE_REGEX (ctest -R),
#              ACCEL_GPU_TARGETS (the build's targets, for a targeted rerun), ACCEL_BENCH_CASES (gpu_compare.py's).
# Exit status: 1 if any line of the summary is FAIL.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
carry=$root/.gpu-carry
build=$root/build-gpu
started=$SECONDS
# Every core (GNU nproc counts only OMP_NUM_THREADS of them once that is set, as it is below).
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
  exit 2
}

# ---------------------------------------------------------------------------------------------------- results

# record STATUS NAME DETAIL: one line of the summary (STATUS: PASS, FAIL, SKIP or INFO), echoed as it happens.
record() {
  printf '%-4s  %-24s %s\n' "$1" "$2" "$3" >>"$results"
  echo "== $1 $2: $3"
}
wanted() { [[ $only == all || ",$only," == *",$1,"* ]]; }
seconds_left() { if ((budget == 0)); then echo 1000000; else echo $((deadline - SECONDS)); fi; }
# fits SECONDS NAME: whether a step that needs that long still fits the budget; records the skip if not.
fits() {
  (($(seconds_left) >= $1)) && return 0
  record SKIP "$2" "out of time: $(seconds_left) s left of the ${budget} s budget, about $1 s needed"
  return 1
}
section() { printf '\n======== %s (%s, %d s into the run)\n' "$1" "$(date -u +%H:%M:%S)" $((SECONDS - started)); }
# Keeps a log under the device tool's 16 MiB a file: its first 2 MiB and last 12 MiB.
cap_log() {
  local file=$1
  [[ -f $file ]] && (($(stat -c %s "$file") > 15 * 1024 * 1024)) || return 0
  { head -c 2M "$file"; printf '\n[... cut to stay under 16 MiB ...]\n'; tail -c 12M "$file"; } >"$file.cut"
  mv "$file.cut" "$file"
}

# ------------------------------------------------------------------------------------------------ the carry

# What the GPU machine lacks, copied from this machine's Debian packages (scripts/setup.sh installs them) and pip.
prepare_carry() {
  local prefix=$carry/prefix source missing=0 version
  for source in /usr/include/{range,meta,concepts,std,catch2,gloo} /usr/lib/cmake/{range-v3,Catch2} \
    /usr/lib/libCatch2WithMain.a; do
    [[ -e $source ]] || {
      echo "scripts/gpu.sh: $source is missing here: run scripts/setup.sh first" >&2
      missing=1
    }
  done
  ((missing)) && return 1
  rm -rf "$carry"
  mkdir -p "$prefix/include" "$prefix/lib/cmake" "$carry/wheels"
  # The CMake packages find their headers relative to themselves (prefix/lib/cmake/X -> prefix/include).
  cp -r /usr/include/{range,meta,concepts,std,catch2,gloo} "$prefix/include/"
  cp -r /usr/lib/cmake/range-v3 /usr/lib/cmake/Catch2 "$prefix/lib/cmake/"
  cp /usr/lib/libCatch2WithMain.a "$prefix/lib/"  # named by Catch2's exported targets, which CMake checks exist
  version=$(sed -n 's/^clang-format==//p' "$root/requirements/test.txt")
  "$root/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$carry/wheels" "clang-format==$version" || return 1
  cat >"$carry/README.txt" <<EOF
Made by scripts/gpu.sh --prepare-carry on $(date -u '+%Y-%m-%d %H:%M UTC'); read by scripts/gpu.sh on the GPU machine.
prefix/: range-v3, Catch2 v2 and Gloo headers with their CMake packages (Debian 12), first in CMAKE_PREFIX_PATH.
wheels/: clang-format $version (requirements/test.txt's pin), for the test format.check, installed with pip --target.
EOF
  if ! git -C "$root" check-ignore -q .gpu-carry; then
    echo "/.gpu-carry/" >>"$(git -C "$root" rev-parse --git-path info/exclude)"
  fi
  echo "scripts/gpu.sh: $carry ready, $(du -sh "$carry" | cut -f1): name .gpu-carry in the device run's carry"
}

# Installs the carried wheels where this run can use them, and finds clang-format among them.
install_carried_wheels() {
  local site=$build/carried-site
  clang_format=""
  if ! compgen -G "$carry/wheels/*.whl" >/dev/null; then
    record FAIL build "no wheels in $carry/wheels: run scripts/gpu.sh --prepare-carry here and name .gpu-carry in carry"
    return 1
  fi
  rm -rf "$site"
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$carry"/wheels/*.whl ||
    return 1
  clang_format=$(find "$site" -type f -name clang-format -perm -u+x | head -1)
  [[ -n $clang_format ]] || record FAIL build "no clang-format program in the carried wheel"
  [[ -n $clang_format ]]
}

# ------------------------------------------------------------------------------------------------ the machine

describe_machine() {
  section "machine"
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "mode: $mode, budget: ${budget} s (0: none), build jobs: $jobs, test jobs: $test_jobs"
  uname -srm
  echo "CPU cores: $cores, memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
  else
    echo "gpu: none (no nvidia-smi)"
  fi
  echo "compiler: $(c++ --version | head -1)"
  echo "cmake: $(cmake --version | head -1), ninja $(ninja --version)"
  echo "nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null) | tail -2 | head -1)"
  "$python" - <<'EOF'
import sys
import torch
print("python:", sys.version.split()[0], sys.executable)
cuda = torch.cuda.is_available()
print("torch:", torch.__version__, "built with CUDA", torch.version.cuda, "| CUDA available:", cuda)
if cuda:
    print("device:", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0),
          "count", torch.cuda.device_count())
    print("nccl:", ".".join(map(str, torch.cuda.nccl.version())), "| cudnn:", torch.backends.cudnn.version())
for name in ("accelerate", "safetensors", "numpy", "tensorboard"):
    try:
        print(f"{name}:", __import__(name).__version__)
    except ImportError as e:
        print(f"{name}: missing ({e})")
EOF
}

# The line `key: value` that describe_machine wrote, without the key.
fact() { sed -n "s/^$1: //p" "$out/env.log" | head -1; }

# ------------------------------------------------------------------------------------------------ the build

# The CMake arguments for this machine's LibTorch, NCCL and CUDA toolkit, in the array cmake_args.
find_dependencies() {
  local torch_prefix nccl_root torch_cuda cuda_root nvcc_path
  torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)') || {
    record FAIL build "$python cannot import torch"
    return 1
  }
  python_path=$("$python" -c 'import sys; print(sys.executable)')
  cmake_args=(-DCMAKE_PREFIX_PATH="$carry/prefix;$torch_prefix" -DACCEL_PYTHON="$python_path"
    -DACCEL_CLANG_FORMAT="$clang_format")
  # mlflow is not in the GPU machine's image (its wheels and their needs are too many to carry): no interop.mlflow.*
  if ! "$python" -c 'import importlib.util as u, sys; sys.exit(0 if u.find_spec("mlflow") else 1)' 2>/dev/null; then
    cmake_args+=(-DACCEL_TEST_MLFLOW=OFF)
    record INFO mlflow "not in $python_path: the interop.mlflow.* tests are not made (ACCEL_TEST_MLFLOW=OFF)"
  fi
  if nccl_root=$("$python" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null); then
    cmake_args+=(-DNCCL_ROOT="$nccl_root")
  fi
  torch_cuda=$("$python" -c 'import torch; print(torch.version.cuda or "")')
  if [[ -n $torch_cuda ]]; then  # PyTorch's CUDA TorchConfig.cmake needs the toolkit (nvcc, headers, libraries)
    cuda_root=${CUDA_HOME:-${CUDA_PATH:-}}
    if [[ -z $cuda_root ]]; then
      nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
      # /usr/local/bin/nvcc may be a wrapper script: the toolkit is where /usr/local/cuda points, if it exists.
      if [[ -x /usr/local/cuda/bin/nvcc ]]; then cuda_root=/usr/local/cuda; else cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc_path")")"); fi
    fi
    # No CUDA code of accel's own: one architecture (the GPU's, else Hopper's) keeps PyTorch's detection quiet.
    local arch
    arch=$("$python" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))' 2>/dev/null || echo 9.0)
    cmake_args+=(-DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" -DCUDAToolkit_ROOT="$cuda_root" -DTORCH_CUDA_ARCH_LIST="$arch")
    # PyTorch's CMake package links libnvrtc, which a toolkit assembled from NVIDIA's wheels may lack (this CPU
    # machine's does): then the copy beside torch (the nvidia-cuda-nvrtc wheel) serves.
    if ! compgen -G "$cuda_root/lib*/libnvrtc.so*" >/dev/null; then
      local nvrtc
      nvrtc=$("$python" "$root/tests/scripts/find_nvrtc.py" 2>/dev/null)
      [[ -n $nvrtc ]] && cmake_args+=(-DCUDA_nvrtc_LIBRARY="$nvrtc")
    fi
  fi
}

# The targets the chosen phases need (--only build: every phase's): on the GPU all of them for the suite; in the dry
# run those of its share of the suite (dry_suite_regex).
build_targets() {
  local targets=(accel_cli)
  if [[ -n ${ACCEL_GPU_TARGETS:-} ]]; then
    printf -- '--target %s ' $ACCEL_GPU_TARGETS
    return 0
  fi
  needs() { wanted "$1" || [[ ",$only," == *",build,"* ]]; }
  if needs suite; then
    [[ $mode == gpu ]] && return 0
    targets+=(accel_tests accel_dist_tests accel_selftest linear_regression char_lm)
  fi
  needs nccl && targets+=(accel_nccl_check)
  { needs autocast || needs resume; } && targets+=(accel_test_programs)  # its link accel_mixed_precision_training
  needs adamw && targets+=(accel_tests)
  needs fp8 && targets+=(accel_test_programs bench_fp8_step)  # its link accel_fp8_layer
  needs bench && targets+=(bench_mlp_step bench_gpu_step)
  printf -- '--target %s ' "${targets[@]}"
}

configure_and_build() {
  local log=$out/build.log start=$SECONDS limit status warnings
  install_carried_wheels >"$log" 2>&1 && find_dependencies || return 1
  section "configure" >>"$log"
  if ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCEL_BUILD_TESTS=ON \
    -DACCEL_BUILD_EXAMPLES=ON -DACCEL_BUILD_BENCHMARKS=ON "${cmake_args[@]}" >>"$log" 2>&1; then
    record FAIL build "CMake failed: $(grep -m1 -A2 'CMake Error' "$log" | tr -s ' \n' ' ' | cut -c1-300)"
    return 1
  fi
  section "build, -j$jobs" >>"$log"
  limit=$(($(seconds_left) - 90 > 60 ? $(seconds_left) - 90 : 60))
  # shellcheck disable=SC2046  # the targets are words
  timeout "$limit" "${nice_cmd[@]}" cmake --build "$build" -j"$jobs" $(build_targets) -- -k 0 >>"$log" 2>&1
  status=$?
  warnings=$(grep -c 'warning:' "$log")
  if ((status == 0)); then
    record PASS build "$(grep -c '^\[' "$log") steps in $((SECONDS - start)) s, $warnings compiler warnings, $(torch_cuda_line)"
  else
    record FAIL build "exit $status after $((SECONDS - start)) s$( ((status == 124)) && echo ' (out of time)'); first error: $(grep -m1 -E 'error:|FAILED:' "$log" | cut -c1-240)"
  fi
  accel_env
  return 0  # what did build can still run
}

torch_cuda_line() {
  grep -q 'ACCEL_TORCH_CUDA=1' "$build/build.ninja" && echo "CUDA paths compiled (ACCEL_TORCH_CUDA=1)" ||
    echo "CPU LibTorch (ACCEL_TORCH_CUDA=0 or no NCCL)"
}

# `accel env` (its GPU lines are part of what issue 38 checks) into env.log.
accel_env() {
  section "accel env" >>"$out/env.log"
  if [[ -x $build/tools/accel ]] && "$build/tools/accel" env >>"$out/env.log" 2>&1; then
    record INFO accel.env "$(grep -E '^(LibTorch CUDA|CUDA driver|NCCL):' "$out/env.log" | tr -s ' ' | paste -sd';' -)"
  else
    record FAIL accel.env "accel env failed or was not built (env.log)"
  fi
}

# ------------------------------------------------------------------------------------------------ the checks

has_gpu() { "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# The devices a check runs on: CUDA on the GPU machine; here the CPU for real, and CUDA to show its skip.
check_devices() { [[ $mode == gpu ]] && echo cuda || echo "cpu cuda"; }

# record_exit NAME STATUS LOG: PASS, SKIP (77: no GPU), FAIL (124: timed out) with the program's last line.
record_exit() {
  local last
  last=$(grep -v '^\s*$' "$3" | tail -1 | cut -c1-300)
  case $2 in
    0) record PASS "$1" "$last" ;;
    77) record SKIP "$1" "$([[ $last == skipped:* ]] && echo "$last" || echo "skipped: no GPU ($last)")" ;;
    124) record FAIL "$1" "timed out ($3)" ;;
    *) record FAIL "$1" "exit $2: $last" ;;
  esac
}

run_nccl_checks() {
  local log=$out/checks.log program=$build/tests/accel_nccl_check part
  [[ -x $program ]] || {
    record FAIL nccl "accel_nccl_check was not built (NCCL not found? build.log)"
    return
  }
  fits 40 nccl.P1 || return
  part=$(mktemp)
  section "dist.nccl.P1.train: accel_nccl_check on one process" >>"$log"
  timeout 180 "$program" >"$part" 2>&1
  record_exit nccl.P1 $? "$part"
  cat "$part" >>"$log"
  if ! has_gpu; then
    record SKIP nccl.P2_one_gpu "skipped: no GPU"
  elif fits 75 nccl.P2_one_gpu; then
    nccl_two_processes_one_gpu >>"$log" 2>&1
  fi
  rm -f "$part"
}

# Two processes on the one GPU (LOCAL_RANK 0 both, as two one-process nodes): NCCL may refuse ("Duplicate GPU").
# When one process fails, the other, left waiting for it, is given 10 s and then stopped.
nccl_two_processes_one_gpu() {
  local port rank pids=() codes=() logs=()
  section "accel_nccl_check, 2 processes on one GPU"
  port=$(free_port)
  for rank in 0 1; do
    logs+=("$(mktemp)")
    RANK=$rank WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port NCCL_DEBUG=WARN \
      timeout 60 "$build/tests/accel_nccl_check" >"${logs[$rank]}" 2>&1 &
    pids+=($!)
  done
  if ! wait -n "${pids[@]}"; then
    sleep 10
    kill "${pids[@]}" 2>/dev/null
  fi
  for rank in 0 1; do
    wait "${pids[$rank]}"
    codes+=($?)
    echo "---- rank $rank (exit ${codes[$rank]})"
    cat "${logs[$rank]}"
  done
  if ((codes[0] == 0 && codes[1] == 0)); then
    record PASS nccl.P2_one_gpu "$(grep -v '^\s*$' "${logs[0]}" | tail -1 | cut -c1-300)"
  elif grep -qiE 'duplicate GPU|ncclCommInitRank failed: invalid usage' "${logs[@]}"; then
    # NCCL returns ncclInvalidUsage ("Duplicate GPU detected" in its WARN line, which 2.28 did not print here)
    record INFO nccl.P2_one_gpu "NCCL refuses 2 processes on one GPU: $(grep -hiE -m1 'duplicate GPU|invalid usage' "${logs[@]}" | head -1 | cut -c1-200)"
  else
    record FAIL nccl.P2_one_gpu "exit codes ${codes[*]}: $(grep -hv '^\s*$' "${logs[@]}" | tail -1 | cut -c1-240)"
  fi
  rm -f "${logs[@]}"
}

# fp16 and bf16 training of the small transformer, accel against torch.autocast + GradScaler on the same weights and
# data (tests/scripts/check_mixed_precision.py says what it checks).
run_autocast_checks() {
  local log=$out/checks.log program=$build/tests/accel_mixed_precision_training device precision part
  [[ -x $program ]] || {
    record FAIL autocast "accel_mixed_precision_training was not built (build.log)"
    return
  }
  for device in $(check_devices); do
    for precision in fp16 bf16; do
      fits 45 "autocast.$device.$precision" || continue
      part=$(mktemp)
      section "autocast parity, $precision on $device" >>"$log"
      timeout 300 "$python" "$root/tests/scripts/check_mixed_precision.py" "$program" "$device" \
        "$build/gpu-work/parity-$device-$precision" parity "$precision" >"$part" 2>&1
      record_exit "autocast.$device.$precision" $? "$part"
      cat "$part" >>"$log"
      rm -f "$part"
    done
  done
}

# save_state / load_state in a fresh process: weights, optimizer, loss scale and the generators (CUDA's on a GPU)
# resumed bit for bit.
run_resume_check() {
  local log=$out/checks.log program=$build/tests/accel_mixed_precision_training device part
  [[ -x $program ]] || {
    record FAIL resume "accel_mixed_precision_training was not built (build.log)"
    return
  }
  for device in $(check_devices); do
    fits 40 "resume.$device" || continue
    part=$(mktemp)
    section "save_state / load_state with the generators, fp16 on $device" >>"$log"
    timeout 300 "$python" "$root/tests/scripts/check_mixed_precision.py" "$program" "$device" \
      "$build/gpu-work/resume-$device" resume >"$part" 2>&1
    record_exit "resume.$device" $? "$part"
    cat "$part" >>"$log"
    rm -f "$part"
  done
}

# accel::multi_tensor_adamw against torch::optim::AdamW on the device (the unit cases tagged [multi_tensor_adamw]:
# bit for bit on the CPU, within rounding on CUDA, whose largest difference they print).
run_adamw_check() {
  local log=$out/checks.log part status
  [[ -x $build/tests/accel_tests ]] || {
    record FAIL adamw "accel_tests was not built (build.log)"
    return
  }
  fits 20 adamw || return
  part=$(mktemp)
  section "multi_tensor_adamw against torch::optim::AdamW" >>"$log"
  timeout 120 "$build/tests/accel_tests" "[multi_tensor_adamw]" >"$part" 2>&1
  status=$?
  cat "$part" >>"$log"
  if ((status == 0)); then
    record PASS adamw "$(grep -m1 'largest difference' "$part" | cut -c1-240)"
  else
    record FAIL adamw "exit $status: $(grep -v '^\s*$' "$part" | tail -1 | cut -c1-240) (checks.log)"
  fi
  rm -f "$part"
}

# ------------------------------------------------------------------------------------------------ benchmarks

# fp8 (issue 36): the cast kernel against ATen's casts, bit for bit; one converted Linear against the
# recipe in Python, both through CUDA's _scaled_mm, bit for bit; then bench_fp8_step's tokens/s against bf16 (target:
# 1.2x), on a transformer where the matmuls dominate, and the same with ATen's casts; then one layer's forward in parts
# (--parts) and a step's kernels (--profile).
run_fp8_checks() {
  local log=$out/checks.log layer=$build/tests/accel_fp8_layer bench=$build/bench/bench_fp8_step recipe part ratio
  [[ -x $layer && -x $bench ]] || {
    record FAIL fp8 "accel_fp8_layer or bench_fp8_step was not built (build.log)"
    return
  }
  if fits 30 fp8.cast_kernel; then
    part=$(mktemp)
    section "fp8 cast kernel against ATen's casts on cuda" >>"$log"
    timeout 120 "$build/tests/accel_fp8_cast_kernel" cuda >"$part" 2>&1
    record_exit fp8.cast_kernel $? "$part"
    cat "$part" >>"$log"
    rm -f "$part"
  fi
  for recipe in tensorwise rowwise delayed; do
    fits 30 "fp8.$recipe" || continue
    part=$(mktemp)
    section "fp8 $recipe: one Linear against tests/scripts/fp8_reference.py on cuda" >>"$log"
    timeout 120 "$python" "$root/tests/scripts/fp8_reference.py" "$layer" "$recipe" "$build/gpu-work/fp8" cuda \
      >"$part" 2>&1
    record_exit "fp8.$recipe" $? "$part"
    cat "$part" >>"$log"
    rm -f "$part"
  done
  [[ $mode == gpu ]] && has_gpu || {
    record SKIP fp8.speed "skipped: no GPU (bench_fp8_step on the CPU: docs/performance.md)"
    return
  }
  fits 100 fp8.speed || return
  section "bench_fp8_step on cuda" >>"$log"
  part=$(mktemp)
  timeout 150 "$bench" --rounds 3 >"$part" 2>&1
  cat "$part" >>"$log"
  for recipe in tensorwise delayed; do
    ratio=$(sed -n "s/^fp8<${recipe}_scaling> .*tokens\/s *\([0-9.]*\)x bf16.*/\1/p" "$part")
    if [[ -z $ratio ]]; then
      record FAIL "fp8.speed.$recipe" "bench_fp8_step printed no ratio: $(tail -1 "$part" | cut -c1-200)"
    elif awk -v r="$ratio" 'BEGIN { exit !(r >= 1.2) }'; then
      record PASS "fp8.speed.$recipe" "${ratio}x bf16's tokens/s ($(sed -n 's/^bf16 *\([0-9]*\) tokens.*/\1/p' "$part") bf16)"
    else
      record FAIL "fp8.speed.$recipe" "${ratio}x bf16's tokens/s, target 1.2x (bench in checks.log)"
    fi
  done
  # The kernel refused at run time (NVRTC or the driver): the casts fell back to ATen's, with LibTorch's warning.
  if grep -q "float8 casts stay ATen's" "$part"; then
    record FAIL fp8.cast_kernel.used "$(grep -m1 "float8 casts stay ATen's" "$part" | cut -c1-300)"
  fi
  # The same with ATen's casts (two passes, the transposes copied): what the kernel gains, in the same run.
  fits 60 fp8.speed.aten_casts || { rm -f "$part"; return; }
  section "ACCEL_FP8_CAST_KERNEL=0 bench_fp8_step on cuda" >>"$log"
  ACCEL_FP8_CAST_KERNEL=0 timeout 120 "$bench" --rounds 3 >"$part" 2>&1
  cat "$part" >>"$log"
  record INFO fp8.speed.aten_casts "$(fp8_ratios "$part")"
  # The same with accel::multi_tensor_adamw (the optimizer's share of the step smaller, as Python's default on CUDA),
  # then at width 8192 (2 blocks), where the matmuls are a larger share still: figures, not the target's check.
  fits 60 fp8.speed.multi_tensor_adamw || { rm -f "$part"; return; }
  section "bench_fp8_step --optimizer multi_tensor_adamw on cuda" >>"$log"
  timeout 120 "$bench" --rounds 3 --optimizer multi_tensor_adamw >"$part" 2>&1
  cat "$part" >>"$log"
  record INFO fp8.speed.multi_tensor_adamw "$(fp8_ratios "$part")"
  fits 100 fp8.speed.width8192 || { rm -f "$part"; return; }
  section "bench_fp8_step --dim 8192 --layers 2 on cuda" >>"$log"
  timeout 150 "$bench" --dim 8192 --layers 2 --steps 5 --rounds 3 --optimizer multi_tensor_adamw >"$part" 2>&1
  cat "$part" >>"$log"
  record INFO fp8.speed.width8192 "$(fp8_ratios "$part")"
  # Where a converted layer's time goes (casts against the matmul they let run in float8), and where a step's goes,
  # kernel by kernel (fp8_profile.txt): what to fuse next.
  fits 30 fp8.parts || { rm -f "$part"; return; }
  section "bench_fp8_step --parts on cuda" >>"$log"
  timeout 60 "$bench" --parts >"$part" 2>&1
  cat "$part" >>"$log"
  record INFO fp8.parts "$(grep '^  ' "$part" | tr -s ' ' | paste -sd';' - | cut -c1-260)"
  fits 45 fp8.profile || { rm -f "$part"; return; }
  timeout 90 "$bench" --profile --optimizer multi_tensor_adamw >"$out/fp8_profile.txt" 2>&1
  record INFO fp8.profile "$(grep 'one step' "$out/fp8_profile.txt" | paste -sd';' - | cut -c1-240) (fp8_profile.txt)"
  rm -f "$part"
}

# The fp8 / bf16 ratios a bench_fp8_step output prints, with bf16's tokens/s.
fp8_ratios() {
  echo "bf16 $(sed -n 's/^bf16 *\([0-9]*\) tokens.*/\1/p' "$1") tokens/s;" \
    "$(sed -n 's/^fp8<\([a-z]*\)_scaling> .* \([0-9.]*x\) bf16.*/\1 \2/p' "$1" | paste -sd' ' -)"
}

run_benchmarks() {
  local log=$out/bench.log device quick=() status
  [[ -x $build/bench/bench_gpu_step && -x $build/bench/bench_mlp_step ]] || {
    record FAIL bench "bench_gpu_step or bench_mlp_step was not built (build.log)"
    return
  }
  fits 60 bench || return
  section "bench_mlp_step: accel against raw LibTorch on the CPU, one thread" >>"$log"
  "$build/bench/bench_mlp_step" 7 1000 >>"$log" 2>&1
  record INFO bench.cpu_step "accel / raw LibTorch on the CPU (tiny MLP, 1 thread): $(sed -n 's/^ratio accel \/ raw (zero_grad), median of per-round ratios: *\([0-9.]*\).*/\1/p' "$log")"
  device=cuda
  if [[ $mode == dry ]]; then
    device=cpu
    quick=(--quick)
  fi
  if [[ $device == cuda ]] && ! has_gpu; then
    record SKIP bench.gpu "skipped: no GPU"
    return
  fi
  section "bench/gpu_compare.py on $device" >>"$log"
  timeout $(($(seconds_left) > 120 ? $(seconds_left) - 30 : 90)) "$python" "$root/bench/gpu_compare.py" \
    "$build/bench/bench_gpu_step" "$python" "$device" "${quick[@]}" >>"$log" 2>&1
  status=$?
  ((status == 0)) || record FAIL bench.gpu "gpu_compare.py exit $status (bench.log)"
  # Its RESULT lines: NAME VALUE TARGET-MET(yes/no/-) DETAIL
  while read -r _ name value met detail; do
    if [[ $mode == gpu && $met == yes ]]; then
      record PASS "bench.$name" "$value $detail"
    elif [[ $mode == gpu && $met == no ]]; then
      record FAIL "bench.$name" "$value $detail (target missed)"
    else
      record INFO "bench.$name" "$value $detail"
    fi
  done < <(grep '^RESULT ' "$log")
}

# ------------------------------------------------------------------------------------------------ the suite

# run_ctest NAME SECONDS CTEST-ARGS...: one pass of the suite, stopped SECONDS from now at the latest (ctest's
# --stop-time, a local time of day, ends the tests still running then, as timeouts).
run_ctest() {
  local name=$1 seconds=$2 part status ran failed skipped selected stop=() start=$SECONDS
  shift 2
  if ((seconds < 45)); then
    record SKIP "$name" "out of time: $(seconds_left) s left of the ${budget} s budget"
    return
  fi
  if ((budget > 0)) && [[ $(date +%F) == $(date -d "+$seconds sec" +%F) ]]; then
    stop=(--stop-time "$(date -d "+$seconds sec" +%H:%M:%S)")
  fi
  part=$(mktemp)
  selected=$(ctest --test-dir "$build" -N "$@" | sed -n 's/^Total Tests: //p')
  section "$name: ctest -j$test_jobs $* ($selected tests)" >>"$out/suite.log"
  timeout $((seconds + 30)) ctest --test-dir "$build" -j"$test_jobs" --output-on-failure "$@" "${stop[@]}" >"$part" 2>&1
  status=$?
  cat "$part" >>"$out/suite.log"
  ran=$(grep -Eo '[0-9]+ tests failed out of [0-9]+' "$part" | tail -1)
  skipped=$(grep -c '\*\*\*Skipped\|Not Run' "$part")
  failed=$(sed -n '/The following tests FAILED:/,$s/^[[:space:]]*[0-9]* - \(.*\)$/\1/p' "$part" | paste -sd';' - |
    cut -c1-1500)
  ran="${ran:-ctest ended with exit $status} (of $selected selected)"
  if ((status == 0)); then
    record PASS "$name" "$ran, $skipped skipped, $((SECONDS - start)) s"
  else
    record FAIL "$name" "$ran in $((SECONDS - start)) s$( ((SECONDS - start >= seconds)) &&
      echo ' (stopped at the budget: the tests not started are not counted, its timeouts may be tests cut short)'); failed: ${failed:-see suite.log}"
  fi
  rm -f "$part"
}

# The suite on the GPU, in two passes: first the tests whose code paths depend on the device (the unit tests and
# examples place on cuda:0, checkpoints hold CUDA generators, NCCL, autocast), stopped in time to leave the benchmarks
# theirs; then the rest, with what time is left. Compile errors and packaging (compile_fail.*, package.consumer.*) do
# not depend on the device and take minutes one after another (they share the build tree): CI runs them.
device_suite='unit\.|dist\.nccl\.|dist\.gloo\.P2\.|dist\.torchrun\.|autocast\.|checkpoint\.|example\.|asan\.|profile\.|tracking\.|restart\.|launcher\.cli_test|gpu_script\.'
not_on_gpu='compile_fail\.|package\.consumer\.'
bench_reserve=200  # seconds the benchmarks take on the GPU (bench/gpu_compare.py, 5 jobs x 3 cases x 2, and bench_mlp_step)
run_suite_device_part() {
  if [[ -n ${ACCEL_GPU_SUITE_REGEX:-} ]]; then
    run_ctest suite $(($(seconds_left) - 20)) -R "$ACCEL_GPU_SUITE_REGEX"
  elif [[ $mode == gpu ]]; then
    local reserve=20
    wanted bench && reserve=$bench_reserve
    run_ctest suite.device $(($(seconds_left) - reserve)) -R "^($device_suite)"
  else
    run_ctest suite $(($(seconds_left) - 20)) -R "$dry_suite_regex"
  fi
}
# The dry run's share of the suite: what exercises the device-dependent code paths on a CPU, within minutes.
dry_suite_regex='^(unit\.|dist\.nccl\.|dist\.gloo\.P2\.(ddp|checkpoint|collectives)$|autocast\.|checkpoint\.generator_resume|example\.(linear_regression|char_lm)|launcher\.cli_test|format\.check|gpu_script\.)'
run_suite_rest() {
  [[ $mode == gpu && -z ${ACCEL_GPU_SUITE_REGEX:-} ]] || return 0
  run_ctest suite.rest $(($(seconds_left) - 20)) -E "^($device_suite|$not_on_gpu)"
}

# ------------------------------------------------------------------------------------------------ summary

write_summary() {
  local nccl_version
  nccl_version=$(fact nccl)
  {
    echo "accel on a GPU: scripts/gpu.sh (mode $mode$([[ $only != all ]] && echo ", --only $only")), $(fact date)"
    echo "machine: $(fact gpu); CPU cores: $(fact 'CPU cores'); kernel $(uname -r)"
    echo "software: torch $(fact torch)${nccl_version:+; nccl $nccl_version}; nvcc $(fact nvcc); $(fact compiler); accelerate $(fact accelerate)"
    echo "wall time: $((SECONDS - started)) s (budget ${budget} s; 0: none)"
    echo
    cat "$results"
    if [[ -f $out/bench.log ]]; then
      echo
      echo "benchmark tables (bench.log):"
      sed -n '/^TABLE/,/^END TABLE/p' "$out/bench.log" | grep -v 'TABLE'
      grep -E '^(tiny MLP step|ratio accel)' "$out/bench.log"
    fi
    echo
    echo "logs in $out: env.log build.log checks.log bench.log suite.log"
  } >"$summary"
  for log in "$out"/*.log; do cap_log "$log"; done
}

# ------------------------------------------------------------------------------------------------ main

mode=gpu
only=all
budget=""
while (($#)); do
  case "$1" in
    --dry-run) mode=dry ;;
    --prepare-carry) mode=carry ;;
    --only)
      only=${2:-}
      shift
      ;;
    --budget)
      budget=${2:-}
      shift
      ;;
    -h | --help) usage ;;
    *)
      echo "scripts/gpu.sh: unknown argument '$1'" >&2
      usage
      ;;
  esac
  shift
done
for phase in ${only//,/ }; do
  case "$phase" in
    all | build | nccl | autocast | resume | adamw | fp8 | bench | suite) ;;
    *)
      echo "scripts/gpu.sh: --only takes build, nccl, autocast, resume, adamw, fp8, bench, suite; not '$phase'" >&2
      exit 2
      ;;
  esac
done
if [[ -n $budget && ! $budget =~ ^[0-9]+$ ]]; then
  echo "scripts/gpu.sh: --budget takes whole seconds, not '$budget'" >&2
  exit 2
fi
if [[ $mode == carry ]]; then
  prepare_carry
  exit
fi

if [[ $mode == gpu ]]; then
  python=${ACCEL_GPU_PYTHON:-python3}
  out=${OUT:-$build/out}
  jobs=$cores
  test_jobs=$((jobs * 3 / 4 > 2 ? jobs * 3 / 4 : 2))
  budget=${budget:-520}
  nice_cmd=()
else
  python=${ACCEL_GPU_PYTHON:-$root/.venv/bin/python}
  out=$build/out
  jobs=2
  test_jobs=2
  budget=${budget:-0}
  nice_cmd=(nice -n 10)
fi
deadline=$((started + budget))
mkdir -p "$out" "$build/gpu-work"
rm -f "$out"/*.log "$out/summary.txt"
summary=$out/summary.txt
results=$(mktemp)
trap 'rm -f "$results"' EXIT
# One thread per process (the tests and benchmarks run processes side by side); Python unbuffered into the logs.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

describe_machine >"$out/env.log" 2>&1
echo "== machine: $(fact gpu); torch $(fact torch)"
if configure_and_build; then
  wanted nccl && run_nccl_checks
  wanted autocast && run_autocast_checks
  wanted resume && run_resume_check
  wanted adamw && run_adamw_check
  wanted fp8 && run_fp8_checks
  wanted suite && run_suite_device_part
  wanted bench && run_benchmarks
  wanted suite && run_suite_rest
fi
write_summary
echo
cat "$summary"
! grep -q '^FAIL' "$results"
