/// \file
/// What rendezvous.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../rendezvous.hpp"

namespace accel::detail {

bool torchrun_agent_store() {
  const char* value = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  return value != nullptr && std::string(value) == "True";
}

c10::intrusive_ptr<c10d::Store> rendezvous_store(const process_environment& env, std::chrono::milliseconds timeout) {
  if (env.standalone()) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions store_options;
  store_options.port = env.master_port;
  store_options.isServer = env.rank == 0 && !torchrun_agent_store();
  store_options.numWorkers = static_cast<std::size_t>(env.world_size);
  store_options.timeout = timeout;
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    // Under a prefix, so that accel's keys never meet a launcher's own in a shared store, nor those of an earlier
    // attempt after torchrun restarted the workers.
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    return c10::make_intrusive<c10d::PrefixStore>(std::string("accel/attempt_") + (attempt != nullptr ? attempt : "0"),
                                                  c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options));
  } catch (const std::exception& e) {
    if (env.rank == 0)
      throw launch_error("accel: rank 0 cannot serve the rendezvous on MASTER_ADDR:MASTER_PORT=" + where + " (" +
                         first_line(e.what()) +
                         "); another job may hold the port: choose a free one (accel launch --master_port 0 picks "
                         "one), or check that MASTER_ADDR is this machine");
    throw launch_error("accel: rank " + std::to_string(env.rank) + " could not join the rendezvous at " + where + " (" +
                       first_line(e.what()) +
                       "); check that rank 0 is running, that MASTER_ADDR/MASTER_PORT are the same on every process "
                       "and that WORLD_SIZE processes were started");
  }
}

}  // namespace accel::detail
