// expect-error: accel::shard_unit: the wrapped module has no forward that takes these arguments
#include <accel/accel.hpp>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
// A ModuleList has no forward: a unit around it cannot be called (as the ModuleList itself cannot).
at::Tensor call(const at::Tensor& x) {
  accel::shard_unit block(torch::nn::ModuleList(torch::nn::Linear(3, 3)));
  return block(x);
}
