// expect-error: broadcast_object_list takes values a c10::IValue holds .* or types with save
#include <accel/accel.hpp>

#include <vector>

namespace {
struct score {
  double value;
};
}  // namespace

void f() {
  accel::accelerator<> acc;
  std::vector<score> scores{{1.0}};
  acc.broadcast_object_list(scores);  // a struct has no c10::IValue form
}
