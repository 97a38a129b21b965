/// \file
/// The umbrella header: `#include <accel/accel.hpp>` and nothing else.
#pragma once

// IWYU pragma: begin_exports
#include "fwd.hpp"
#include "concepts.hpp"
#include "options.hpp"
#include "precision.hpp"
#include "parallel.hpp"
#include "sharded_data_parallel.hpp"
#include "shard_unit.hpp"
#include "accumulation.hpp"
#include "device.hpp"
#include "batch_range.hpp"
#include "gradient_state.hpp"
#include "prepared_model.hpp"
#include "prepared_optimizer.hpp"
#include "prepared_scheduler.hpp"
#include "prepared_range.hpp"
#include "collectives.hpp"
#include "launch.hpp"
#include "shard.hpp"
#include "data_loader.hpp"
#include "checkpoint_error.hpp"
#include "safetensors.hpp"
#include "model_weights.hpp"
#include "checkpoint.hpp"
#include "accelerator.hpp"
#include "config_file.hpp"
#include "progress.hpp"
#include "tracking.hpp"
#include "dispatch.hpp"
// IWYU pragma: end_exports
