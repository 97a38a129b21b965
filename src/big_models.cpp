// accel::compiled: big models: device maps, dispatch and offload, memory estimates, module trees, the device mesh,
// run-time dispatch of configurations. (Every impl/*.ipp is compiled by exactly one of src/*.cpp; lint.compiled_part
// checks.)
#include <accel/impl/big_modeling.ipp>
#include <accel/impl/device_map.ipp>
#include <accel/impl/device_mesh.ipp>
#include <accel/impl/dispatch.ipp>
#include <accel/impl/memory_estimate.ipp>
#include <accel/impl/module_tree.ipp>
