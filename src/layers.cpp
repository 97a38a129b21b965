// accel::compiled: the layers the policies replace or route: fp8's linear layers and casts, tensor parallelism's
// layers and the linear routing both use (each .ipp compiles to nothing on a LibTorch without float8 or the routing
// key), and context parallelism's ring attention. (Every impl/*.ipp is compiled by exactly one of src/*.cpp;
// lint.compiled_part checks.)
#include <accel/detail/fp8/impl/casts.ipp>
#include <accel/detail/fp8/impl/cuda_casts.ipp>
#include <accel/detail/fp8/impl/conversion.ipp>
#include <accel/detail/fp8/impl/delayed_scaling.ipp>
#include <accel/detail/fp8/impl/float8_gather.ipp>
#include <accel/detail/fp8/impl/linear.ipp>
#include <accel/detail/support/impl/linear_routing.ipp>
#include <accel/detail/tensor_parallel/impl/layers.ipp>
#include <accel/detail/context_parallel/impl/ring.ipp>
#include <accel/impl/context_parallel.ipp>
#include <accel/impl/fp8.ipp>
#include <accel/impl/fully_sharded_tensor_parallel.ipp>
#include <accel/impl/tensor_parallel.ipp>
