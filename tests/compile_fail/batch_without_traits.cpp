// expect-error: accel cannot move this batch type to a device: specialise accel::batch_traits<T>
#include <accel/accel.hpp>
#include <vector>
struct my_batch {
  at::Tensor pixels;
};
void f() {
  accel::accelerator<> acc;
  std::vector<my_batch> data;
  for (auto& b : acc.prepare(data)) (void)b;
}
