// accel::compiled: the services beside training: the profiler, progress bars, logging, the config file, the
// launcher's environment, memory figures. (Every impl/*.ipp is compiled by exactly one of src/*.cpp; lint.compiled_part
// checks.)
#include <accel/detail/comm/impl/flight_trace.ipp>
#include <accel/detail/support/impl/counting_allocator.ipp>
#include <accel/detail/support/impl/directory_entries.ipp>
#include <accel/detail/support/impl/pickle_value.ipp>
#include <accel/detail/support/impl/text.ipp>
#include <accel/detail/support/impl/worker_variables.ipp>
#include <accel/impl/config_file.ipp>
#include <accel/impl/launch.ipp>
#include <accel/impl/launch_processes.ipp>
#include <accel/impl/logging.ipp>
#include <accel/impl/memory.ipp>
#include <accel/impl/profile_events.ipp>
#include <accel/impl/profiler.ipp>
#include <accel/impl/progress.ipp>
#include <accel/impl/seed.ipp>
