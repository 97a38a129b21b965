// expect-error: set_gradient_accumulation_steps: this accelerator's accumulation policy fixes N at compile time
#include <accel/accel.hpp>
// accumulate<4> is N = 4 in the type: only accumulate_dynamic takes a new N at run time.
void retry(accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<4>>& acc) {
  acc.set_gradient_accumulation_steps(8);
}
