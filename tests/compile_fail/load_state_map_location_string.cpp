// expect-error: no matching function for call to .*load_state
#include <accel/accel.hpp>

// Accelerate's load_state(map_location="gpu") raises TypeError at run time; accel's map_location is an enum, so a
// string (or any value but accel::map_location::cpu and ::on_device) does not compile.
void f() {
  accel::accelerator<> acc;
  acc.load_state("checkpoint", "cpu");
}
