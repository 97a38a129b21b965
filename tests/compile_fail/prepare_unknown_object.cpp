// expect-error: prepare\(\) takes models .* this argument is none of them
#include <accel/accel.hpp>
void f() {
  accel::accelerator<> acc;
  auto prepared = acc.prepare(42);
}
