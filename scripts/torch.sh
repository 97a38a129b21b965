# Sourced by the scripts: which LibTorch a build uses, chosen by ACCEL_TORCH.
#   ACCEL_TORCH=pip     (default) LibTorch 2.13 from the PyTorch wheel in .venv/ (scripts/setup.sh installs it)
#   ACCEL_TORCH=debian  Debian's libtorch-dev 1.13.1 (found through its TorchConfig.cmake in the default prefix)
# Sets torch_cmake_args (CMake arguments), torch_build_suffix (what a build directory's name ends with: nothing, or
# -torch1.13) and venv_python (the Python with torch 2.13 and the peers; scripts/test.sh passes it to the tests as
# ACCEL_PYTHON). Either way, NCCL for data_parallel<nccl> comes from the nvidia-nccl-cu13 wheel in .venv (NCCL_ROOT),
# where `scripts/setup.sh test` installed it (the example's set-up does not: its build has no data_parallel<nccl>).
venv_python=$root/.venv/bin/python
nccl_args=()
if nccl_root=$("$venv_python" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null); then
  nccl_args=(-DNCCL_ROOT="$nccl_root")
fi
torch_build_suffix=""
case "${ACCEL_TORCH:-pip}" in
  pip)
    torch_cmake_args=(-DCMAKE_PREFIX_PATH="$("$venv_python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
                      "${nccl_args[@]}")
    ;;
  debian)
    torch_cmake_args=("${nccl_args[@]}")
    torch_build_suffix=-torch1.13
    ;;
  *)
    echo "ACCEL_TORCH must be pip (LibTorch 2.13 from .venv) or debian (libtorch-dev 1.13.1), not '$ACCEL_TORCH'" >&2
    exit 2
    ;;
esac
