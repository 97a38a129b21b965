// accel's headers for the tests' shared fixtures (support.hpp) and precompiled header: every public header but the
// services (tracking.hpp, profiler.hpp, profile_events.hpp, progress.hpp), which the files that use them include
// themselves, so that a change to a service recompiles those files and accel::compiled's, and relinks the rest.
#pragma once

#include <accel/fwd.hpp>
#include <accel/concepts.hpp>
#include <accel/options.hpp>
#include <accel/precision.hpp>
#include <accel/fp8.hpp>
#include <accel/parallel.hpp>
#include <accel/sharded_data_parallel.hpp>
#include <accel/hybrid_sharded.hpp>
#include <accel/tensor_parallel.hpp>
#include <accel/fully_sharded_tensor_parallel.hpp>
#include <accel/shard_unit.hpp>
#include <accel/construct_sharded.hpp>
#include <accel/accumulation.hpp>
#include <accel/device.hpp>
#include <accel/batch_range.hpp>
#include <accel/gradient_state.hpp>
#include <accel/prepared_model.hpp>
#include <accel/prepared_optimizer.hpp>
#include <accel/multi_tensor_adamw.hpp>
#include <accel/prepared_scheduler.hpp>
#include <accel/prepared_range.hpp>
#include <accel/collectives.hpp>
#include <accel/launch.hpp>
#include <accel/launch_processes.hpp>
#include <accel/seed.hpp>
#include <accel/memory.hpp>
#include <accel/memory_estimate.hpp>
#include <accel/device_map.hpp>
#include <accel/module_tree.hpp>
#include <accel/big_modeling.hpp>
#include <accel/logging.hpp>
#include <accel/shard.hpp>
#include <accel/data_loader.hpp>
#include <accel/checkpoint_error.hpp>
#include <accel/safetensors.hpp>
#include <accel/model_weights.hpp>
#include <accel/removable_handle.hpp>
#include <accel/checkpoint.hpp>
#include <accel/accelerator.hpp>
#include <accel/local_sgd.hpp>
#include <accel/config_file.hpp>
#include <accel/dispatch.hpp>
#include <accel/detail/sharded_configurations.hpp>
