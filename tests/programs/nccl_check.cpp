// data_parallel<nccl> with one process: builds and links wherever NCCL is; on a GPU it trains a few steps and
// checks NCCL's all-reduce against Gloo's. Without a GPU it exits 77 (CTest: skipped).
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>

int main() {
  if (!torch::cuda::is_available()) {
    std::cout << "no CUDA device: data_parallel<nccl> built and linked, not run\n";
    return 77;
  }
  accel::accelerator<accel::fp32, accel::data_parallel<accel::nccl>> acc;
  torch::manual_seed(0);
  auto net = torch::nn::Linear(16, 4);
  torch::optim::SGD opt(net->parameters(), 0.1);
  auto [model, optimizer] = acc.prepare(net, opt);
  float first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    auto x = torch::randn({32, 16}, acc.device());
    auto loss = torch::mse_loss(model(x), x.narrow(1, 0, 4));
    acc.backward(loss);
    optimizer.step();
    optimizer.zero_grad();
    (step == 0 ? first : last) = loss.item<float>();
  }
  auto values = torch::randn({1000}, acc.device());
  auto nccl_sum = acc.reduce(values).cpu();
  accel::detail::gloo_communicator gloo(accel::process_environment{}, std::chrono::seconds(60));
  auto expected = accel::detail::reduce(gloo, values.cpu(), accel::reduction::sum);
  std::cout << "nccl: loss " << first << " -> " << last
            << ", all-reduce matches: " << torch::allclose(nccl_sum, expected) << "\n";
  return last < first && torch::allclose(nccl_sum, expected) ? EXIT_SUCCESS : EXIT_FAILURE;
}
