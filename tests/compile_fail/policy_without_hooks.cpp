// expect-error: this precision policy lacks a constructor from accel::options, forward_scope\(device\), backward\(loss\)
#include <accel/accel.hpp>
struct my_precision {
  using policy_category = accel::precision_tag;
};
accel::accelerator<my_precision> acc;
