// One data-parallel training job of the DDP benchmark (bench/ddp_compare.py runs it under `accel launch`):
// an MLP of the given width on 2 Gloo processes, SGD, batch 32 per process, one thread per process. Strategies:
//   accel          data_parallel<gloo> as users get it: bucketed all-reduce overlapped with backward
//   per_parameter  backward without sync, then one blocking all-reduce per parameter (the naive loop)
//   flat           backward without sync, then all gradients flattened into one all-reduce
// Process 0 prints one line: `strategy width ms_per_step`.
#include <accel/accel.hpp>
#include <torch/torch.h>
#include <torch/csrc/utils/tensor_flatten.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

using accelerator_type = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;

/// The accelerator's process group (process-wide: the same object data_parallel uses).
accel::detail::gloo_communicator& process_group() {
  return accel::detail::process_group<accel::detail::gloo_communicator>(std::chrono::minutes(30));
}

/// All-reduces (averages) the gradients after backward, the naive ways.
void average_per_parameter(accelerator_type& acc, torch::nn::Module& net) {
  auto& comm = process_group();
  for (auto& p : net.parameters()) {
    comm.all_reduce(p.mutable_grad(), accel::reduction::sum).wait();
    p.mutable_grad().div_(acc.num_processes());
  }
}
void average_flat(accelerator_type& acc, torch::nn::Module& net) {
  std::vector<torch::Tensor> grads;
  for (auto& p : net.parameters()) grads.push_back(p.grad());
  auto flat = torch::utils::flatten_dense_tensors(grads);
  process_group().all_reduce(flat, accel::reduction::sum).wait();
  flat.div_(acc.num_processes());
  auto pieces = torch::utils::unflatten_dense_tensors(flat, grads);
  for (std::size_t i = 0; i < grads.size(); ++i) grads[i].copy_(pieces[i]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s accel|per_parameter|flat WIDTH STEPS WARMUP\n", argv[0]);
    return 2;
  }
  const std::string strategy = argv[1];
  const int width = std::atoi(argv[2]), steps = std::atoi(argv[3]), warmup = std::atoi(argv[4]);
  torch::set_num_threads(1);
  accelerator_type acc;
  auto net = bench::wide_mlp(width);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  auto [model, opt] = acc.prepare(net, optimizer);
  const auto data = bench::wide_batches(width, acc.process_index());

  auto step = [&](int i) {
    const auto& [x, y] = data[i % data.size()];
    auto loss = torch::mse_loss(model(x), y);
    if (strategy == "accel") {
      acc.backward(loss);
    } else {
      {
        auto local = acc.no_sync(model);
        acc.backward(loss);
      }
      if (strategy == "flat")
        average_flat(acc, *net);
      else
        average_per_parameter(acc, *net);
    }
    opt.step();
    opt.zero_grad();
  };
  const double ms = bench::seconds_per_step(acc, step, steps, warmup) * 1e3;
  if (acc.is_main_process()) std::printf("%s %d %.4f\n", strategy.c_str(), width, ms);
}
