/// \file
/// Forward declarations of accel's public types. Includes no LibTorch header, so a translation unit
/// that only names policies (or a compile-fail test) stays cheap.
#pragma once

#include <cstddef>

#define ACCEL_VERSION_MAJOR 0
#define ACCEL_VERSION_MINOR 9
#define ACCEL_VERSION_PATCH 0

namespace accel {

/// Category tags: a policy opts into a family with `using policy_category = accel::precision_tag;`.
struct precision_tag {};
struct parallel_tag {};
struct accumulation_tag {};
/// Tag for a communication backend of `data_parallel<Backend>`.
struct backend_tag {};

// Precision policies (precision.hpp).
struct fp32;
struct bf16;
struct fp16;

// Parallel policies and their backends (parallel.hpp).
struct single_process;
struct gloo;
struct nccl;
template <class Backend>
struct data_parallel;
// Sharded data parallelism (sharded_data_parallel.hpp).
template <class Backend>
struct zero1;
template <class Backend>
struct zero2;
template <class Backend>
struct fully_sharded;
// Hybrid sharding, HSDP (hybrid_sharded.hpp).
template <class Backend>
struct hybrid_sharded;
// Fully sharded and hybrid sharded data parallelism beside tensor parallelism (fully_sharded_tensor_parallel.hpp).
template <class Backend>
struct fully_sharded_tensor_parallel;
template <class Backend>
struct hybrid_sharded_tensor_parallel;

// Accumulation policies (accumulation.hpp).
template <int N>
struct accumulate;
using no_accumulation = accumulate<1>;
struct accumulate_dynamic;

struct options;

// The accelerator's services, each in a header of its own that the files using it include: trackers
// (tracking.hpp), the profiler (profiler.hpp), progress bars (progress.hpp).
class metric;
struct hyperparameter;
class general_tracker;
class profiler;
struct profile_options;
struct progress_options;
enum class state_dict_type;

}  // namespace accel
