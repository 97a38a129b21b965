// expect-error: this precision policy lacks forward_scope\(device\), backward\(loss\), step\(optimizer\)
#include <accel/accel.hpp>
struct my_precision {
  using policy_category = accel::precision_tag;
};
accel::accelerator<my_precision> acc;
