"""Prints the path of libnvrtc that NVIDIA's wheels installed in this Python (nvidia-cuda-nvrtc: torch's dependency
on a CUDA build, requirements/test.txt's here), or nothing. For tests/CMakeLists.txt (fp8.cast_kernel.nvrtc) and
scripts/gpu.sh (the library PyTorch's CMake package links, where the CUDA toolkit lacks it)."""
import glob
import os

try:
    import nvidia
except ImportError:
    raise SystemExit(0)
found = sorted(path for root in nvidia.__path__
               for path in glob.glob(os.path.join(root, "**", "libnvrtc.so*"), recursive=True))
print(found[0] if found else "")
