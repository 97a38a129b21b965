// expect-error: accel::shard_unit: the wrapped module has no forward that takes these arguments
#include <accel/accel.hpp>
#include <torch/nn/modules/linear.h>
#include <string>
// A unit takes what its module's forward takes: a Linear takes a tensor, not a string.
at::Tensor call() {
  accel::shard_unit block(torch::nn::Linear(3, 3));
  return block(std::string("not a tensor"));
}
