/// \file
/// The umbrella header: `#include <accel/accel.hpp>` and nothing else.
#pragma once

// IWYU pragma: begin_exports
#include "fwd.hpp"
#include "concepts.hpp"
#include "options.hpp"
#include "precision.hpp"
#include "parallel.hpp"
#include "accumulation.hpp"
#include "device.hpp"
#include "prepared_model.hpp"
#include "prepared_optimizer.hpp"
#include "prepared_scheduler.hpp"
#include "prepared_range.hpp"
#include "accelerator.hpp"
// IWYU pragma: end_exports
