// fp8.data_parallel.P2 (run by `accel launch --nproc_per_node 2`): accel::fp8 under data_parallel<gloo> against one
// process training the same model on the whole batch with the same recipe, for tensorwise and delayed scaling.
// Each process checks, and exits non-zero on a failure:
// - the parameters after 8 SGD steps match the one-process run's within 5e-4 (tensorwise scales each process's
//   input by its own amax, so the float8 roundings differ a little; the gradients are averaged as under bf16);
// - delayed scaling: every process holds the same amax histories and scales (the amaxes are max-reduced at each
//   step), and after the first step the input and weight scales equal the one-process run's bit for bit (the max of
//   the processes' amaxes is the whole batch's).
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "fp8_tower.hpp"

#if ACCEL_HAS_FLOAT8
namespace {

using accel_test::tower;

int failures = 0;
void expect(bool condition, const std::string& what) {
  if (!condition) {
    std::cerr << "FAILED: " << what << "\n";
    ++failures;
  }
}

template <class Recipe>
void compare(const char* recipe) {
  const accel::options options{.cpu = true, .fp8 = {.amax_history_len = 4}};
  accel::accelerator<accel::fp8<Recipe>, accel::data_parallel<accel::gloo>> acc(options);
  accel::accelerator<accel::fp8<Recipe>> whole(options);
  const int P = acc.num_processes(), r = acc.process_index(), B = 32;
  torch::manual_seed(3);
  tower net, baseline;
  for (std::size_t i = 0; i < net->parameters().size(); ++i)
    baseline->parameters()[i].detach().copy_(net->parameters()[i]);
  torch::optim::SGD sgd(net->parameters(), 0.05), baseline_sgd(baseline->parameters(), 0.05);
  auto [model, opt] = acc.prepare(net, sgd);
  auto [baseline_model, baseline_opt] = whole.prepare(baseline, baseline_sgd);
  for (int step = 0; step < 8; ++step) {
    torch::manual_seed(100 + step);  // the same global batch on every process
    const auto x = torch::randn({B * P, 16}), y = torch::randn({B * P, 4});
    acc.backward(torch::mse_loss(model(x.narrow(0, r * B, B)), y.narrow(0, r * B, B)));
    opt.step();
    opt.zero_grad();
    whole.backward(torch::mse_loss(baseline_model(x), y));
    baseline_opt.step();
    baseline_opt.zero_grad();
    if constexpr (std::is_same_v<Recipe, accel::delayed_scaling>) {
      const auto& mine = acc.precision().scaling_state();
      const auto everyone = acc.gather(mine.scales().unsqueeze(0));
      expect(torch::equal(everyone[0], everyone[P - 1]), std::string(recipe) + ": every process has the same scales");
      if (step == 0)
        for (int column : {0, 1, 3, 4})  // a's and b's input and weight
          expect(torch::equal(mine.scales()[column], whole.precision().scaling_state().scales()[column]),
                 std::string(recipe) + ": after the first step, scale " + std::to_string(column) +
                     " is the whole batch's");
    }
  }
  double largest = 0;
  for (std::size_t i = 0; i < net->parameters().size(); ++i)
    largest = std::max(largest, (net->parameters()[i] - baseline->parameters()[i]).abs().max().item<double>());
  std::cout << "process " << r << ", " << recipe << ": largest parameter difference from one process " << largest
            << "\n";
  expect(largest < 5e-4, std::string(recipe) + ": the parameters match one process with the whole batch within 5e-4");
}

}  // namespace
#endif

int main() {
#if !ACCEL_HAS_FLOAT8
  std::cerr << "fp8_data_parallel: this LibTorch has no float8 (accel::fp8 needs 2.4 or newer)\n";
  return 77;
#else
  compare<accel::tensorwise_scaling>("tensorwise");
  compare<accel::delayed_scaling>("delayed");
  return failures == 0 ? 0 : 1;
#endif
}
