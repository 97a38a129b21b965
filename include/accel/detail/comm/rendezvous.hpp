/// \file
/// Rendezvous of the processes of a job through c10d's TCPStore, shared by the Gloo and NCCL communicators.
// IWYU pragma: private, include <accel/parallel.hpp>
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <string>

#include "../config.hpp"
#include "../../collectives.hpp"
#include "../../launch.hpp"

namespace accel::detail {

/// True under torchrun, whose agent already serves a TCPStore on MASTER_PORT for its workers to share.
ACCEL_DECL bool torchrun_agent_store();

/// Rendezvous: rank 0 serves a TCPStore on MASTER_ADDR:MASTER_PORT (torchrun's agent serves it instead), the
/// others connect to it. A world of one needs no network, so it gets an in-memory store.
ACCEL_DECL c10::intrusive_ptr<c10d::Store> rendezvous_store(const process_environment& env,
                                                            std::chrono::milliseconds timeout);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/rendezvous.ipp"
#endif
