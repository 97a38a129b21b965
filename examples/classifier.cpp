// Classify the points of three interleaved spirals with an MLP, with bf16 mixed precision, gradient accumulation
// over 2 micro-batches, and data parallelism over the processes that `accel launch` starts. The test accuracy is
// gathered from every process with gather_for_metrics, so that each test point counts exactly once. The training
// loss goes to classifier_run/spirals/ as CSV and TensorBoard event files (`tensorboard --logdir classifier_run`).
// Build and run: scripts/example.sh classifier
// which starts it as `accel launch --nproc_per_node 2 ./classifier` (`accel` is the launcher built in tools/).
#include <accel/accel.hpp>
#include <torch/torch.h>

#include <cmath>
#include <iomanip>
#include <ranges>
#include <sstream>
#include <vector>

using sample = torch::data::Example<>;  // data: the point's 2 coordinates; target: its spiral, 0 to 2

// `n` noisy points on each of `arms` spiral arms that wind around the origin, interleaved.
std::vector<sample> spirals(int n, int arms) {
  std::vector<sample> points;
  for (int k = 0; k < arms; ++k) {
    const auto radius = torch::rand({n});
    const auto angle = 2 * M_PI * k / arms + 3 * M_PI * radius + 0.2 * torch::randn({n});
    const auto xy = torch::stack({radius * torch::cos(angle), radius * torch::sin(angle)}, 1);
    for (int i = 0; i < n; ++i) points.push_back({xy[i], torch::tensor(int64_t{k})});
  }
  return points;
}

int main() {
  // One process per worker of `accel launch`; forward passes under bfloat16 autocast; the optimizer steps every
  // 2 micro-batches, and gradients are all-reduced between the processes only then.
  accel::accelerator<accel::bf16, accel::data_parallel<accel::gloo>, accel::accumulate<2>> acc(
      {.project = {.project_dir = "classifier_run"}, .log_with = {accel::tracker::csv, accel::tracker::tensorboard}});

  // Every process builds the same data from the same seed: the prepared data loaders deal out its batches.
  torch::manual_seed(0);
  const auto points = spirals(1000, 3);
  std::vector<sample> train_set, test_set;  // 80% / 20%, at random
  const auto order = torch::randperm(static_cast<int64_t>(points.size()));
  for (int64_t i = 0; i < order.size(0); ++i)
    (i < 2400 ? train_set : test_set).push_back(points[order[i].item<int64_t>()]);

  torch::nn::Sequential net(torch::nn::Linear(2, 128), torch::nn::ReLU(), torch::nn::Linear(128, 128),
                            torch::nn::ReLU(), torch::nn::Linear(128, 3));
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(1e-4));
  // Batches of 32 points per process: 2 processes x 2 micro-batches make 128 points per optimizer step.
  accel::data_loader train_loader(train_set, {.batch_size = 32, .shuffle = true, .seed = 1});
  accel::data_loader test_loader(test_set, {.batch_size = 64});
  auto [model, opt, train_batches, test_batches] = acc.prepare(net, optimizer, train_loader, test_loader);
  acc.init_trackers("spirals", {{"lr", 1e-2}, {"batch_size", 32}, {"precision", "bf16"}});

  // A progress bar on the main process: redrawn on a terminal, a line every 30 s in a log file.
  for (int epoch : acc.progress(std::views::iota(1, 61), {.description = "epochs"})) {
    auto loss_sum = torch::zeros({});
    for (auto&& batch : train_batches) {  // this process's batches; each pass is a new shuffle
      auto micro_step = acc.accumulate(model);
      auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
      acc.backward(loss);
      opt.step();       // only every 2nd micro-batch (and on the last batch of the epoch)
      opt.zero_grad();  // likewise
      loss_sum += loss.detach();
    }
    if (epoch % 10 == 0) {
      // The mean over this process's batches, averaged over the processes.
      const auto loss = acc.reduce(loss_sum / static_cast<double>(train_batches.size()), accel::reduction::mean);
      acc.log({{"train_loss", loss}}, epoch);  // main process only
      acc.print("epoch", epoch, "train loss =", loss.item<double>());
    }
  }
  acc.end_training();  // closes the trackers' files

  // Accuracy on the test set: each process predicts its test batches; gather_for_metrics collects every process's
  // predictions and drops the points repeated to give every process a full last batch.
  model->eval();
  torch::NoGradGuard no_grad;
  int64_t correct = 0, total = 0;
  for (auto&& batch : test_batches) {
    const auto predicted = model(batch.data).argmax(1);
    const auto [all_predicted, all_targets] = acc.gather_for_metrics(std::pair{predicted, batch.target});
    correct += all_predicted.eq(all_targets).sum().item<int64_t>();
    total += all_targets.size(0);
  }
  std::ostringstream accuracy;
  accuracy << std::fixed << std::setprecision(3) << static_cast<double>(correct) / static_cast<double>(total);
  acc.print("test accuracy =", accuracy.str(), "on", total, "test points");
}
