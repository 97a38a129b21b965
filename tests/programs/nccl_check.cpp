// data_parallel<nccl>, zero1<nccl>, zero2<nccl> and fully_sharded<nccl> (also with its layer as a shard unit, gathered
// on the separate NCCL communicator): built and linked wherever NCCL is; on a GPU each trains a few steps (the sharded
// ones to data_parallel's weights), and NCCL's all-reduce and reduce-scatter are checked: on one process against
// Gloo's and against the identity, on several (scripts/gpu.sh starts two on one GPU, where NCCL allows it) against
// the sums of the values every process contributed. Without a GPU it exits 77 (CTest: skipped).
#include "accel_headers.hpp"
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>

namespace {

/// 50 SGD steps under `Policy` of a Linear (with `unit`, as a shard unit); the first and last loss, and the trained
/// weight.
template <class Policy>
auto train(bool unit = false) {
  accel::accelerator<accel::fp32, Policy> acc;
  torch::manual_seed(0);
  torch::nn::Sequential net;
  if (unit)
    net->push_back(accel::shard_unit(torch::nn::Linear(16, 4)));
  else
    net->push_back(torch::nn::Linear(16, 4));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto [model, optimizer] = acc.prepare(net, opt);
  float first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    auto x = torch::randn({32, 16}, acc.device());
    auto loss = torch::mse_loss(model(x), x.narrow(1, 0, 4));
    acc.backward(loss);
    optimizer.step();
    optimizer.zero_grad();
    (step == 0 ? first : last) = loss.template item<float>();
  }
  std::cout << Policy::name() << ": loss " << first << " -> " << last << "\n";
  return std::tuple{first, last, acc.get_state_dict(model)[0].second};  // fully_sharded: net->weight is a slice
}

/// Several processes: the all-reduce and reduce-scatter of values that say which process sent them, against their
/// sums (small integers: exact in float32).
bool collectives_of_several(accel::accelerator<accel::fp32, accel::data_parallel<accel::nccl>>& acc) {
  const int processes = acc.num_processes(), rank = acc.process_index();
  const auto positions = torch::arange(processes * 250, torch::kFloat);
  auto values = (positions * (rank + 1)).to(acc.device());
  const auto sum_of_ranks = static_cast<float>(processes * (processes + 1) / 2);
  const bool all_reduce_matches = torch::equal(acc.reduce(values).cpu(), positions * sum_of_ranks);
  auto scattered = torch::empty({250}, values.options());
  accel::detail::process_group<accel::detail::nccl_communicator>(std::chrono::seconds(60))
      .reduce_scatter_into(scattered, values)
      .wait();
  const bool reduce_scatter_matches =
      torch::equal(scattered.cpu(), positions.narrow(0, rank * 250, 250) * sum_of_ranks);
  std::cout << "process " << rank << " of " << processes << ": all-reduce is the sum: " << all_reduce_matches
            << ", reduce-scatter is this process's part of the sum: " << reduce_scatter_matches << "\n";
  return all_reduce_matches && reduce_scatter_matches;
}

/// One process: NCCL's all-reduce against Gloo's, and a reduce-scatter that must be the identity.
bool collectives_of_one(accel::accelerator<accel::fp32, accel::data_parallel<accel::nccl>>& acc) {
  auto values = torch::randn({1000}, acc.device());
  auto nccl_sum = acc.reduce(values).cpu();
  accel::detail::gloo_communicator gloo(accel::process_environment{}, std::chrono::seconds(60));
  const bool all_reduce_matches =
      torch::allclose(nccl_sum, accel::detail::reduce(gloo, values.cpu(), accel::reduction::sum));
  auto scattered = torch::empty_like(values);
  accel::detail::process_group<accel::detail::nccl_communicator>(std::chrono::seconds(60))
      .reduce_scatter_into(scattered, values)
      .wait();
  const bool reduce_scatter_matches = torch::equal(scattered.cpu(), values.cpu());
  std::cout << "all-reduce matches Gloo: " << all_reduce_matches
            << ", reduce-scatter of one process is the identity: " << reduce_scatter_matches << "\n";
  return all_reduce_matches && reduce_scatter_matches;
}

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::cout << "no CUDA device: data_parallel, zero1, zero2 and fully_sharded over NCCL built and linked, not run\n";
    return 77;
  }
  const auto [first, last, weight] = train<accel::data_parallel<accel::nccl>>();
  const bool zero1_same = torch::equal(std::get<2>(train<accel::zero1<accel::nccl>>()), weight);
  const bool zero2_same = torch::equal(std::get<2>(train<accel::zero2<accel::nccl>>()), weight);
  const bool fully_sharded_same = torch::equal(std::get<2>(train<accel::fully_sharded<accel::nccl>>()), weight) &&
                                  torch::equal(std::get<2>(train<accel::fully_sharded<accel::nccl>>(true)), weight);
  accel::accelerator<accel::fp32, accel::data_parallel<accel::nccl>> acc;
  const bool collectives_match = acc.num_processes() == 1 ? collectives_of_one(acc) : collectives_of_several(acc);
  std::cout << "zero1 == data_parallel: " << zero1_same << ", zero2 == data_parallel: " << zero2_same
            << ", fully_sharded == data_parallel: " << fully_sharded_same << "\n";
  const bool sharded_same = zero1_same && zero2_same && fully_sharded_same;
  return last < first && collectives_match && sharded_same ? EXIT_SUCCESS : EXIT_FAILURE;
}
