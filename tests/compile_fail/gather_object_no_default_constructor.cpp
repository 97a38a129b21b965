// expect-error: gather_object takes values a c10::IValue holds .* or types with save.* and a default constructor
#include <accel/accel.hpp>

namespace {
/// A serialiser, but nothing to load into: it cannot be built empty.
struct named {
  explicit named(std::string text) : name(std::move(text)) {}
  void save(torch::serialize::OutputArchive& out) const { out.write("name", c10::IValue(name)); }
  void load(torch::serialize::InputArchive& in) {
    c10::IValue value;
    in.read("name", value);
    name = value.toStringRef();
  }
  std::string name;
};
}  // namespace

void f() {
  accel::accelerator<> acc;
  auto all = acc.gather_object(named("x"));
}
