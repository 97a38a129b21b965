// expect-error: accel::construct_sharded builds a model for accel::fully_sharded
#include <accel/accel.hpp>
void build(accel::accelerator<accel::fp32, accel::hybrid_sharded<accel::gloo>>& acc) {
  auto net = accel::construct_sharded(acc, [] { return torch::nn::Linear(3, 4); });
}
