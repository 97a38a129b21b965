# Finds what accel::accel needs and defines the imported target accel::torch. Used by the build and installed with
# the package, so `find_package(accel CONFIG)` in another project finds LibTorch the same way.
#
# LibTorch: PyTorch's own TorchConfig.cmake when it can be found (official LibTorch, or pip's torch through
# -DTorch_DIR / CMAKE_PREFIX_PATH = `python3 -c 'import torch;print(torch.utils.cmake_prefix_path)'`; Debian's
# libtorch-dev 1.13 ships one too). Otherwise the header and library layout of Debian's build: headers under
# /usr/include and /usr/include/torch/csrc/api/include, libraries torch, torch_cpu and c10, built with Gloo.
#
# Imported targets are scoped to the directory that finds them, so this file runs again in each directory that
# calls find_package(accel); the `if(NOT TARGET ...)` checks keep it from defining anything twice. A missing
# dependency sets ACCEL_MISSING_DEPENDENCY (a message) instead of stopping CMake, so that a package config can
# report "not found" and an optional find_package(accel) can go on.
unset(ACCEL_MISSING_DEPENDENCY)

find_package(range-v3 CONFIG QUIET)
if(NOT range-v3_FOUND)
  set(ACCEL_MISSING_DEPENDENCY "accel: range-v3 not found: install Debian's librange-v3-dev (scripts/setup.sh does)")
  return()
endif()
if(NOT TARGET accel::range_v3)
  add_library(accel::range_v3 INTERFACE IMPORTED)
  if(TARGET range-v3::range-v3)
    target_link_libraries(accel::range_v3 INTERFACE range-v3::range-v3)
  else()  # Debian's range-v3 0.12 names its target without a namespace
    target_link_libraries(accel::range_v3 INTERFACE range-v3)
  endif()
endif()

if(NOT TARGET accel::torch)
  find_package(Torch CONFIG QUIET)
  if(Torch_FOUND)
    add_library(accel::torch INTERFACE IMPORTED)
    target_link_libraries(accel::torch INTERFACE ${TORCH_LIBRARIES})
    if(TORCH_CXX_FLAGS)
      separate_arguments(_accel_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
      target_compile_options(accel::torch INTERFACE ${_accel_torch_flags})
    endif()
    set(ACCEL_TORCH_SOURCE "TorchConfig.cmake in ${Torch_DIR}")
    # c10d's ProcessGroupGloo.hpp includes gloo/*.h, which PyTorch's wheels do not ship (official LibTorch archives
    # and Debian's libtorch-dev do). Only declarations are used from them (Gloo's code is in libtorch_cpu), so Debian's
    # libgloo-dev headers serve; tests/distributed/no_gloo_code.cmake and dist.gloo.P2.one_libtorch check the result.
    find_path(ACCEL_GLOO_INCLUDE_DIR NAMES gloo/rendezvous/store.h HINTS ${TORCH_INCLUDE_DIRS})
    if(NOT ACCEL_GLOO_INCLUDE_DIR)
      set(ACCEL_MISSING_DEPENDENCY
        "accel: Gloo's headers (gloo/rendezvous/store.h) not found. c10d's ProcessGroupGloo.hpp needs them and "
        "PyTorch's wheel does not ship them: install Debian's libgloo-dev (scripts/setup.sh does), or pass "
        "-DACCEL_GLOO_INCLUDE_DIR=/path/above/gloo.")
      return()
    endif()
    target_include_directories(accel::torch SYSTEM INTERFACE ${ACCEL_GLOO_INCLUDE_DIR})
    # Where libtorch_cpu is, from its imported target: TorchConfig's own TORCH_LIBRARY variable searches the system's
    # directories first, so with Debian's libtorch-dev also installed it names Debian's library, not this one.
    get_target_property(_accel_configurations torch_cpu IMPORTED_CONFIGURATIONS)
    if(_accel_configurations)
      list(GET _accel_configurations 0 _accel_configuration)
      get_target_property(_accel_torch_cpu torch_cpu IMPORTED_LOCATION_${_accel_configuration})
    else()
      get_target_property(_accel_torch_cpu torch_cpu IMPORTED_LOCATION)
    endif()
    get_filename_component(ACCEL_TORCH_LIBRARY_DIR "${_accel_torch_cpu}" DIRECTORY)
  else()
    find_path(ACCEL_TORCH_API_INCLUDE_DIR NAMES torch/torch.h PATH_SUFFIXES torch/csrc/api/include)
    find_path(ACCEL_TORCH_INCLUDE_DIR NAMES ATen/ATen.h)
    find_library(ACCEL_TORCH_LIBRARY NAMES torch)
    find_library(ACCEL_TORCH_CPU_LIBRARY NAMES torch_cpu)
    find_library(ACCEL_C10_LIBRARY NAMES c10)
    foreach(_accel_var ACCEL_TORCH_API_INCLUDE_DIR ACCEL_TORCH_INCLUDE_DIR ACCEL_TORCH_LIBRARY ACCEL_TORCH_CPU_LIBRARY
                       ACCEL_C10_LIBRARY)
      if(NOT ${_accel_var})
        set(ACCEL_MISSING_DEPENDENCY
          "accel: LibTorch not found (${_accel_var}). Install Debian's libtorch-dev (scripts/setup.sh does), or point "
          "CMake at PyTorch's TorchConfig.cmake with -DTorch_DIR=... or -DCMAKE_PREFIX_PATH=\"$(python3 -c "
          "'import torch;print(torch.utils.cmake_prefix_path)')\".")
        return()
      endif()
    endforeach()
    add_library(accel::torch INTERFACE IMPORTED)
    # CMake drops implicit directories such as /usr/include from the command line, as it must.
    target_include_directories(accel::torch SYSTEM INTERFACE ${ACCEL_TORCH_INCLUDE_DIR} ${ACCEL_TORCH_API_INCLUDE_DIR})
    target_link_libraries(accel::torch INTERFACE ${ACCEL_TORCH_LIBRARY} ${ACCEL_TORCH_CPU_LIBRARY} ${ACCEL_C10_LIBRARY})
    # The definitions Debian's libtorch_cpu was built with (the same TorchConfig.cmake passes on).
    target_compile_definitions(accel::torch INTERFACE USE_DISTRIBUTED USE_C10D_GLOO USE_RPC USE_TENSORPIPE)
    set(ACCEL_TORCH_SOURCE "header and library layout (${ACCEL_TORCH_LIBRARY})")
    get_filename_component(ACCEL_TORCH_LIBRARY_DIR "${ACCEL_TORCH_LIBRARY}" DIRECTORY)
  endif()
endif()

# NCCL, optional: accel::nccl adds what `data_parallel<nccl>` needs (nccl.h, libnccl, the CUDA runtime) to
# accel::accel. Searched under NCCL_ROOT (CMake or environment variable), CUDA_HOME and /usr/local/cuda, where the
# CUDA toolkit puts them; NVIDIA's wheel (nvidia-nccl-cu13: nvidia/nccl/{include,lib}) has only libnccl.so.2.
if(NOT TARGET accel::nccl)
  set(_accel_cuda_roots ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{CUDA_HOME} $ENV{CUDA_PATH} /usr/local/cuda)
  find_path(ACCEL_NCCL_INCLUDE_DIR NAMES nccl.h HINTS ${_accel_cuda_roots} PATH_SUFFIXES include)
  find_path(ACCEL_CUDART_INCLUDE_DIR NAMES cuda_runtime.h HINTS ${_accel_cuda_roots} PATH_SUFFIXES include)
  find_library(ACCEL_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_accel_cuda_roots} PATH_SUFFIXES lib64 lib)
  find_library(ACCEL_CUDART_LIBRARY NAMES cudart HINTS ${_accel_cuda_roots} PATH_SUFFIXES lib64 lib)
  if(ACCEL_NCCL_INCLUDE_DIR AND ACCEL_CUDART_INCLUDE_DIR AND ACCEL_NCCL_LIBRARY AND ACCEL_CUDART_LIBRARY)
    add_library(accel::nccl INTERFACE IMPORTED)
    target_include_directories(accel::nccl SYSTEM INTERFACE ${ACCEL_NCCL_INCLUDE_DIR} ${ACCEL_CUDART_INCLUDE_DIR})
    target_link_libraries(accel::nccl INTERFACE ${ACCEL_NCCL_LIBRARY} ${ACCEL_CUDART_LIBRARY})
    # A LibTorch built with CUDA gives NCCL its current stream; Debian's (CPU only) has no CUDA tensors.
    if(TORCH_CUDA_LIBRARIES)
      target_compile_definitions(accel::nccl INTERFACE ACCEL_WITH_NCCL ACCEL_TORCH_CUDA=1)
    else()
      target_compile_definitions(accel::nccl INTERFACE ACCEL_WITH_NCCL ACCEL_TORCH_CUDA=0)
    endif()
    set(ACCEL_NCCL_FOUND TRUE)
  else()
    set(ACCEL_NCCL_FOUND FALSE)
  endif()
endif()
