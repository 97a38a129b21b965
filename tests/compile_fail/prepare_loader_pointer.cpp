// expect-error: this argument points to a range of batches .* acc\.prepare\(\*loader\)
#include <accel/accel.hpp>
#include <torch/data.h>

#include <vector>

namespace {
struct numbers : torch::data::datasets::Dataset<numbers, torch::data::Example<>> {
  torch::data::Example<> get(std::size_t i) override { return {torch::full({1}, double(i)), torch::zeros({1})}; }
  torch::optional<std::size_t> size() const override { return 8; }
};
}  // namespace

void f() {
  accel::accelerator<> acc;
  auto loader = torch::data::make_data_loader(numbers().map(torch::data::transforms::Stack<>()), 4);
  auto prepared = acc.prepare(loader);  // the unique_ptr, not *loader
}
