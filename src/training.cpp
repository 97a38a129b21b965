// accel::compiled: the training step's engines: communicators, gradient synchronisation, sharding, data loading, the
// policies. (Every impl/*.ipp is compiled by exactly one of src/*.cpp; lint.compiled_part checks.)
#include <accel/detail/impl/compat.ipp>
#include <accel/detail/comm/impl/flight_recorder.ipp>
#include <accel/detail/comm/impl/gloo_communicator.ipp>
#include <accel/detail/comm/impl/process_barrier.ipp>
#include <accel/detail/comm/impl/rendezvous.ipp>
#include <accel/detail/data/impl/worker_threads.ipp>
#include <accel/detail/gradient_sync/impl/comm_hooks.ipp>
#include <accel/detail/gradient_sync/impl/reducer.ipp>
#include <accel/detail/gradient_sync/impl/uneven_join.ipp>
#include <accel/detail/prepared/impl/registry.ipp>
#include <accel/detail/sharding/impl/construction.ipp>
#include <accel/detail/sharding/impl/optimizer_shards.ipp>
#include <accel/detail/sharding/impl/owned_shards.ipp>
#include <accel/detail/sharding/impl/shard_layout.ipp>
#include <accel/detail/sharding/impl/storage.ipp>
#include <accel/detail/sharding/impl/unit_hooks.ipp>
#include <accel/impl/accumulation.ipp>
#include <accel/impl/collectives.ipp>
#include <accel/impl/data_loader.ipp>
#include <accel/impl/hybrid_sharded.ipp>
#include <accel/impl/multi_tensor_adamw.ipp>
#include <accel/impl/parallel.ipp>
#include <accel/impl/pipeline.ipp>
#include <accel/impl/pipeline_schedule.ipp>
#include <accel/impl/precision.ipp>
#include <accel/impl/shard.ipp>
