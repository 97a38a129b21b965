// expect-error: accel::construct_sharded builds a model for accel::fully_sharded
#include <accel/accel.hpp>
// fully_sharded_tensor_parallel shards tp slices, which parallelize_module makes from a whole model: construct_sharded
// would hand it slices of the whole.
void build(accel::accelerator<accel::fp32, accel::fully_sharded_tensor_parallel<accel::gloo>>& acc) {
  auto net = accel::construct_sharded(acc, [] { return torch::nn::Linear(3, 4); });
}
