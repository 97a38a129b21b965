// expect-error: this precision policy lacks a constructor from \(accel::options, c10::Device\), forward_scope\(device\)
#include <accel/accel.hpp>
struct my_precision {
  using policy_category = accel::precision_tag;
};
accel::accelerator<my_precision> acc;
