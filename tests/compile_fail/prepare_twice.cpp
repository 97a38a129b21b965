// expect-error: this object is already prepared; use the prepared object as it is
#include <accel/accel.hpp>
#include <torch/optim/sgd.h>
void f(torch::optim::SGD& optimizer) {
  accel::accelerator<> acc;
  auto opt = acc.prepare(optimizer);
  auto again = acc.prepare(opt);
}
