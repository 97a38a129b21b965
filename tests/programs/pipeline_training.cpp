// Pipeline parallelism (accel/pipeline.hpp), alone or under `accel launch --parallelism_config_pp_size P`:
//   `pipeline_training train SCHEDULE STAGES_PER_PROCESS MICRO_BATCHES STEPS`: a 16-layer MLP (a Sequential of 8
//     Linear + Tanh pairs) trained STEPS steps of SGD through the pipeline, every process's stages then compared with
//     the same model trained in one process, which accumulates the same micro-batches' gradients (what gradient
//     accumulation in one process does): parameters and every step's loss within 1e-6. With dp_replicate beside pp,
//     the one process averages the replicas' gradients as they do. Also reports the distance to one process that
//     takes each batch whole.
//   `pipeline_training train_bf16 SCHEDULE STAGES_PER_PROCESS MICRO_BATCHES STEPS`: the same under
//     accelerator<bf16>: each stage's forward under bfloat16 autocast, against the one process's forward under
//     autocast, its output in float32 before the loss (a prepared model's bf16), within 1e-6, and further than
//     1e-6 from the same training in float32.
//   `pipeline_training train_fully_sharded SCHEDULE STAGES_PER_PROCESS MICRO_BATCHES STEPS`: the same under an
//     accelerator<fp32, fully_sharded<gloo>> (pp x dp_shard, the stages sharded by the pipeline);
//     `train_hybrid_sharded ...` under hybrid_sharded<gloo> (pp x dp_replicate x dp_shard).
//   `pipeline_training train_tp SCHEDULE STAGES_PER_PROCESS MICRO_BATCHES STEPS`: the same under tensor_parallel,
//     each Linear pair split column- then row-parallel across the tp group, each split parameter's slice against
//     the same slice of one process's.
//   `pipeline_training checkpoint_tp DIR`: under pp x tp, save_model gathers the split layers whole and load_model
//     slices them again. `resume_save_tp DIR` / `resume_load_tp DIR`: resume's modes under pp x tp (the split
//     layers' momentum gathered whole, and sliced again), and `resume_load_after_tp DIR` what tp saved resumed
//     without it, each within 1e-6 of one process.
//   `pipeline_training save DIR` / `load DIR`: 20 steps of 1F1B (4 micro-batches) at this job's pp, then the whole
//     model's weights saved to DIR; loaded at another pp (or in one process), every stage equal bit for bit to the
//     model trained so in one process.
//   `pipeline_training resume_save DIR` / `resume_load DIR`: 10 steps of SGD with momentum, then `save_state` (the
//     weights and the optimizer's momentum buffers) at this job's pp; loaded at another pp (or in one process) and
//     trained 10 more steps, equal bit for bit to one process trained 20 steps straight.
//   `pipeline_training split`: under pp = 2, split_before {"4"} gives the first process children 0-3 and the second
//     4-15 under their names; names out of order, unknown, or too few or many are refused, naming the fix.
//   `pipeline_training metrics`: gather_for_metrics of a prepared range's batches (sample numbers 0 to 8) under pp
//     (and dp_replicate): every sample exactly once, in order, the duplicates that complete the last round dropped,
//     each from the process on the last stage (the other stages pass negated numbers, which must not appear).
//   `pipeline_training memory MICRO_BATCHES`: the first process's peak of CPU storage (accel's counting allocator)
//     during a step of GPipe and of 1F1B, against one micro-batch's activations: GPipe holds all m micro-batches'
//     activations at once, 1F1B at most pp of them.
#include "accel_headers.hpp"
#include <accel/memory.hpp>
#include <accel/pipeline.hpp>
#include <torch/torch.h>

#include "support.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace programs::pipeline_training {

namespace {

using accelerator_t = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
using bf16_accelerator = accel::accelerator<accel::bf16, accel::data_parallel<accel::gloo>>;
using tp_accelerator = accel::accelerator<accel::fp32, accel::tensor_parallel<accel::gloo>>;
using fully_sharded_accelerator = accel::accelerator<accel::fp32, accel::fully_sharded<accel::gloo>>;
using hybrid_sharded_accelerator = accel::accelerator<accel::fp32, accel::hybrid_sharded<accel::gloo>>;
constexpr double learning_rate = 0.2;

torch::nn::Sequential make_model(int width) {
  torch::manual_seed(5);
  torch::nn::Sequential model;
  for (int layer = 0; layer < 8; ++layer) {
    torch::nn::Linear linear(width, width);
    torch::NoGradGuard no_grad;
    torch::nn::init::orthogonal_(linear->weight);  // the signal crosses 8 layers, so the first ones learn too
    model->push_back(linear);
    model->push_back(torch::nn::Tanh());
  }
  return model;
}

at::Tensor mse(const at::Tensor& output, const at::Tensor& target) { return torch::mse_loss(output, target); }

accel::pipeline_schedule schedule_named(const std::string& name) {
  const std::map<std::string, accel::pipeline_schedule> schedules{
      {"gpipe", accel::pipeline_schedule::gpipe},
      {"1f1b", accel::pipeline_schedule::one_f_one_b},
      {"interleaved", accel::pipeline_schedule::interleaved_1f1b},
      {"zero_bubble", accel::pipeline_schedule::zero_bubble}};
  return schedules.at(name);
}

/// The global batches: step t's batch for replica r is batches[t * replicas + r] (a prepared range gives process r
/// of R the batches r, r + R, ...).
std::vector<accel_test::batch> global_batches(int steps, int replicas, int rows, int width) {
  auto batches = accel_test::regression_batches(steps * replicas, rows, width, width, 17);
  const auto teacher = torch::randn({width, width}) / std::sqrt(static_cast<double>(width));
  for (auto& [x, y] : batches) y = torch::tanh(x.matmul(teacher));  // a target the model can learn
  return batches;
}

/// Step `step`'s batch, its first half on every tenth step: the pipeline learns its messages' shapes again when the
/// batch's shape changes (and back).
accel_test::batch every_tenth_halved(const accel_test::batch& batch, int step) {
  if (step % 10 != 9) return batch;
  const auto half = batch.first.size(0) / 2;
  return {batch.first.narrow(0, 0, half), batch.second.narrow(0, 0, half)};
}

/// The same training in one process: each replica's micro-batches accumulated in order, the replicas' gradients
/// summed in rank order and averaged, as the pipeline and its all-reduce do. `whole`: each batch whole instead.
/// Returns every step's loss for each replica's batch ([step][replica]); `first_input_gradients`, where given,
/// receives each replica's input gradient at the first step.
std::vector<std::vector<double>> train_in_one_process(torch::nn::Sequential& model,
                                                      const std::vector<accel_test::batch>& batches, int steps,
                                                      int replicas, int micro_batches, bool whole, bool bf16 = false,
                                                      double momentum = 0,
                                                      std::vector<at::Tensor>* first_input_gradients = nullptr) {
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(learning_rate).momentum(momentum));
  std::vector<std::vector<double>> losses;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<at::Tensor>> replica_grads;
    losses.emplace_back();
    for (int replica = 0; replica < replicas; ++replica) {
      optimizer.zero_grad();
      const auto [batch_input, y] =
          every_tenth_halved(batches[static_cast<std::size_t>(step * replicas + replica)], step);
      const auto x = step == 0 && first_input_gradients ? batch_input.detach().requires_grad_() : batch_input;
      const int parts = whole ? 1 : micro_batches;
      auto loss = torch::zeros({});
      for (int mb = 0; mb < parts; ++mb) {
        at::Tensor output;
        {
          std::optional<accel::detail::autocast_scope> autocast;  // bf16: what a prepared model's forward runs under
          if (bf16) autocast.emplace(c10::DeviceType::CPU, at::kBFloat16);
          output = model->forward(x.chunk(parts)[mb]);
        }
        if (bf16) output = output.to(at::kFloat);
        auto part = mse(output, y.chunk(parts)[mb]) / parts;
        part.backward();
        loss += part.detach();
      }
      losses.back().push_back(loss.item<double>());
      if (x.requires_grad()) first_input_gradients->push_back(x.grad());
      std::vector<at::Tensor> grads;
      for (const auto& parameter : model->parameters()) grads.push_back(parameter.grad().clone());
      replica_grads.push_back(std::move(grads));
    }
    auto parameters = model->parameters();
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      auto sum = replica_grads[0][i].clone();
      for (int replica = 1; replica < replicas; ++replica) sum += replica_grads[static_cast<std::size_t>(replica)][i];
      parameters[i].mutable_grad() = sum / replicas;
    }
    optimizer.step();
  }
  return losses;
}

/// The index of this process along a mesh dimension (0 without one).
template <class Accelerator>
int index_along(const Accelerator& acc, const std::string& dimension) {
  const auto& mesh = acc.parallelism_config();
  return mesh && mesh->has(dimension) ? mesh->index_along(dimension, acc.process_index()) : 0;
}

/// The model, under tensor_parallel split as Megatron splits an MLP: each Linear pair (children 0 and 2, 4 and 6,
/// ...) column- then row-parallel across the tp group.
template <class Accelerator>
torch::nn::Sequential model_for(Accelerator& acc, int width) {
  auto model = make_model(width);
  if constexpr (std::is_same_v<Accelerator, tp_accelerator>) {
    accel::tensor_parallel_plan plan;
    for (int pair = 0; pair < 4; ++pair) {
      plan.emplace_back(std::to_string(4 * pair), accel::colwise_parallel{});
      plan.emplace_back(std::to_string(4 * pair + 2), accel::rowwise_parallel{});
    }
    accel::parallelize_module(acc, model, plan);
  }
  return model;
}

/// The largest difference between what `pipe` updates and the parameters of the same names in `reference`: under
/// dp_shard, this process's shard of each (`shard_index`), against the same part of the reference's, zero-padded;
/// under tp, a split parameter's slice (`tp_index`) against the same slice of the reference's.
double distance(const accel::pipeline& pipe, const torch::nn::Sequential& reference, int shard_index = 0,
                int tp_index = 0) {
  const auto expected = reference->named_parameters();
  const auto names = pipe.module()->named_parameters().keys();
  const auto held = pipe.parameters();
  double largest = 0;
  for (std::size_t i = 0; i < held.size(); ++i) {
    const auto* found = expected.find(names[i]);
    if (found == nullptr) throw std::runtime_error("the pipeline's " + names[i] + " is not in the whole model");
    auto want = found->detach();
    for (std::int64_t dimension = 0; dimension < want.dim() && pipe.shards() == 1; ++dimension)
      if (held[i].size(dimension) != want.size(dimension))  // split by tp
        want = want.narrow(dimension, tp_index * held[i].size(dimension), held[i].size(dimension));
    if (pipe.shards() > 1) {
      const auto length = held[i].numel();
      auto padded = torch::zeros({length * pipe.shards()}, want.options());
      padded.narrow(0, 0, want.numel()).copy_(want.reshape({-1}));
      want = padded.narrow(0, shard_index * length, length);
    }
    largest = std::max(largest, (held[i] - want).abs().max().item<double>());
  }
  return largest;
}

/// `distance` at this process's place in the mesh: its dp_shard and tp indices.
template <class Accelerator>
double distance(const Accelerator& acc, const accel::pipeline& pipe, const torch::nn::Sequential& reference) {
  return distance(pipe, reference, index_along(acc, "dp_shard"), index_along(acc, "tp"));
}

/// Under tp: each split parameter holds 1/tp of the whole (a column-parallel layer's weight and bias, a row-parallel
/// layer's weight; not its bias).
void check_split(const accel::pipeline& pipe, const torch::nn::Sequential& reference, int tp) {
  if (tp == 1) return;
  std::int64_t held = 0, expected = 0;
  for (const auto& shard : pipe.parameters()) held += shard.numel();
  const auto whole = reference->named_parameters();
  for (const auto& name : pipe.module()->named_parameters().keys()) {
    const bool row_bias = std::stoi(name) % 4 == 2 && name.ends_with("bias");
    expected += whole[name].numel() / (row_bias ? 1 : tp);
  }
  std::printf("pipeline_training: the stages hold %lld parameter elements of their split layers (expected %lld)\n",
              static_cast<long long>(held), static_cast<long long>(expected));
  std::fflush(stdout);
  if (held != expected) throw std::runtime_error("the pipeline's layers are not split across the tp group");
}

/// Under dp_shard, between steps: the module's parameters hold nothing, and the shards 1/dp_shard of each whole
/// parameter (rounded up).
void check_sharded(const accel::pipeline& pipe, const torch::nn::Sequential& reference) {
  if (pipe.shards() == 1) return;
  std::int64_t left = 0, held = 0, expected = 0;
  for (const auto& parameter : pipe.module()->parameters()) left += parameter.numel();
  for (const auto& shard : pipe.parameters()) held += shard.numel();
  const auto whole = reference->named_parameters();
  for (const auto& name : pipe.module()->named_parameters().keys())
    expected += (whole[name].numel() + pipe.shards() - 1) / pipe.shards();
  std::printf(
      "pipeline_training: between steps the stages hold %lld parameter elements whole and %lld in shards "
      "(expected 0 and %lld)\n",
      static_cast<long long>(left), static_cast<long long>(held), static_cast<long long>(expected));
  std::fflush(stdout);
  if (left != 0 || held != expected) throw std::runtime_error("the pipeline's parameters are not sharded");
}

/// The step's timing lies within the step: some computing, no more than the schedule's time, itself no more than
/// the call's; its mean cost per kind of action, times the `actions` of each kind this process ran, is its computing
/// time, with a weight part only where the schedule splits the backward.
void check_timing(const accel::pipeline_timing& timing, std::chrono::steady_clock::duration call, std::size_t actions,
                  bool split_backward) {
  const double wall = std::chrono::duration<double>(call).count();
  if (!(timing.computing > 0 && timing.computing <= timing.seconds && timing.seconds <= wall && timing.bubble() >= 0 &&
        timing.bubble() < 1))
    throw std::runtime_error("the pipeline's step timing is inconsistent: " + std::to_string(timing.computing) +
                             " s computing of " + std::to_string(timing.seconds) + " s in a call of " +
                             std::to_string(wall) + " s");
  const auto& costs = timing.costs;
  const double summed = static_cast<double>(actions) * (costs.forward + costs.backward_input + costs.backward_weight);
  if (!(costs.forward > 0 && costs.backward_input > 0 && (costs.backward_weight > 0) == split_backward &&
        std::abs(summed - timing.computing) <= 1e-9 * timing.computing + 1e-12))
    throw std::runtime_error("the pipeline's costs per action (forward " + std::to_string(costs.forward) +
                             " s, backward " + std::to_string(costs.backward_input) + " s, weight " +
                             std::to_string(costs.backward_weight) + " s, " + std::to_string(actions) +
                             " of each) do not make its " + std::to_string(timing.computing) + " s computing");
}

/// On the first stage's process, the input's gradient equals one process's; elsewhere it has none.
void check_input_gradient(const accel::pipeline& pipe, const at::Tensor& input, const at::Tensor& expected) {
  const auto& stages = pipe.local_stages();
  const bool first = std::find(stages.begin(), stages.end(), 0) != stages.end();
  if (first != input.grad().defined())
    throw std::runtime_error(first ? "the input requires grad but got none on the first stage's process"
                                   : "the input got a gradient on a process without the first stage");
  if (!first) return;
  const double gap = (input.grad() - expected).abs().max().item<double>();
  std::printf("pipeline_training: the input's gradient %.3g from one process's\n", gap);
  if (gap > 1e-6) throw std::runtime_error("the input's gradient differs from one process's");
}

template <class Accelerator>
int train(const std::string& schedule, int stages_per_process, int micro_batches, int steps) {
  constexpr int width = 32, rows = 16;
  constexpr bool bf16 = std::is_same_v<typename Accelerator::precision_type, accel::bf16>;
  Accelerator acc{accel::options{.cpu = true}};
  const auto& mesh = acc.parallelism_config();
  const int replicas = mesh ? mesh->sizes().dp_replicate * mesh->sizes().dp_shard : 1;  // the data-parallel ranks
  const auto batches = global_batches(steps, replicas, rows, width);
  // The batches through a prepared range, which gives each dp replica its own and the pp peers the same ones.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> samples;
  for (const auto& [x, y] : batches)
    for (int row = 0; row < rows; ++row) samples.emplace_back(x[row], y[row]);
  accel::data_loader loader(samples, {.batch_size = rows});
  auto prepared = acc.prepare(loader);

  accel::pipeline pipe(
      acc, model_for(acc, width),
      {.schedule = schedule_named(schedule), .micro_batches = micro_batches, .stages_per_process = stages_per_process});
  torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(learning_rate));
  std::vector<double> losses;
  at::Tensor first_input;
  for (auto&& batch : prepared) {
    const auto [batch_input, y] = every_tenth_halved(batch, static_cast<int>(losses.size()));
    // The first step's input requires grad: it gets its gradient on the first stage's process, as in one process.
    // It is made by an op that saves tensors for its backward (a product), which one backward through it may free.
    if (losses.empty()) first_input = batch_input.detach().requires_grad_();
    const auto x = losses.empty() ? first_input * torch::ones_like(first_input) : batch_input;
    const auto begun = std::chrono::steady_clock::now();
    losses.push_back(pipe.step(x, y, mse).template item<double>());
    check_timing(pipe.last_step_timing(), std::chrono::steady_clock::now() - begun,
                 pipe.local_stages().size() * static_cast<std::size_t>(micro_batches), schedule == "zero_bubble");
    optimizer.step();
    optimizer.zero_grad();
  }

  auto reference = make_model(width);
  std::vector<at::Tensor> first_input_gradients;
  const auto expected = train_in_one_process(reference, batches, steps, replicas, micro_batches, /*whole=*/false, bf16,
                                             0, &first_input_gradients);
  auto whole_batches = make_model(width);
  (void)train_in_one_process(whole_batches, batches, steps, replicas, micro_batches, /*whole=*/true, bf16);
  // Each process's loss is its replica's batch's (as any data-parallel loss); the model learns over the steps.
  const int replica = mesh ? mesh->index_along("dp", acc.process_index()) : 0;
  double loss_gap = 0, first_losses = 0, last_losses = 0;
  for (int step = 0; step < steps; ++step) {
    const auto& at_step = expected[static_cast<std::size_t>(step)];
    loss_gap = std::max(loss_gap,
                        std::abs(losses[static_cast<std::size_t>(step)] - at_step[static_cast<std::size_t>(replica)]));
    for (double loss : at_step) {
      if (step < 10) first_losses += loss;
      if (step >= steps - 10) last_losses += loss;
    }
  }
  check_sharded(pipe, reference);
  check_split(pipe, reference, mesh ? mesh->sizes().tp : 1);
  check_input_gradient(pipe, first_input, first_input_gradients.at(static_cast<std::size_t>(replica)));
  const double gap = distance(acc, pipe, reference);
  std::printf("pipeline_training: process %d (stages", acc.process_index());
  for (int stage : pipe.local_stages()) std::printf(" %d", stage);
  std::printf(
      ") %s%s: %zu actions; loss %.6f -> %.6f; parameters %.3g from one process (%s), losses %.3g; %.3g from "
      "one process taking whole batches\n",
      schedule.c_str(), bf16 ? " in bf16" : "", pipe.actions().size(), losses.front(), losses.back(), gap,
      gap == 0 ? "bit for bit" : "not bitwise", loss_gap, distance(acc, pipe, whole_batches));
  std::fflush(stdout);
  std::printf("pipeline_training: the last 10 steps' loss is %.3f of the first 10's\n", last_losses / first_losses);
  std::fflush(stdout);
  if (!(last_losses < 0.9 * first_losses)) throw std::runtime_error("the one-process training did not learn");
  if (gap > 1e-6 || loss_gap > 1e-6) throw std::runtime_error("the pipeline's training differs from one process's");
  if constexpr (bf16) {  // the stages' autocast mattered: the same training in float32 ends elsewhere
    auto in_float32 = make_model(width);
    (void)train_in_one_process(in_float32, batches, steps, replicas, micro_batches, /*whole=*/false);
    const double float32_gap = distance(acc, pipe, in_float32);
    std::printf("pipeline_training: %.3g from one process in float32\n", float32_gap);
    if (!(float32_gap > 1e-6)) throw std::runtime_error("the bf16 pipeline trained as float32 does");
  }
  return 0;
}

/// Bytes allocated (accel's counting allocator) and held by one micro-batch's forward through this process's stage.
std::int64_t one_micro_batch(const accel::pipeline& pipe, const at::Tensor& x) {
  const auto cpu = c10::Device(c10::kCPU);
  const auto before = accel::memory_stats(cpu).allocated;
  torch::nn::Sequential stage = pipe.module();  // the same modules
  auto output = stage->forward(x);
  return accel::memory_stats(cpu).allocated - before;
}

/// The peak of CPU storage above the start of a step (the second: the first allocates the gradients), in
/// micro-batches' activations of this process's stage, and one micro-batch's activations in bytes.
std::pair<double, std::int64_t> held_activations(accelerator_t& acc, const std::string& schedule, int micro_batches,
                                                 const accel_test::batch& batch, int rows) {
  constexpr int width = 256;
  const auto cpu = c10::Device(c10::kCPU);
  accel::pipeline pipe(acc, make_model(width), {.schedule = schedule_named(schedule), .micro_batches = micro_batches});
  const auto x = batch.first.narrow(0, 0, rows * micro_batches);
  const auto y = batch.second.narrow(0, 0, x.size(0));
  (void)pipe.step(x, y, mse);
  const auto activations = one_micro_batch(pipe, x.narrow(0, 0, rows));
  accel::reset_peak_memory_stats(cpu);
  const auto base = accel::memory_stats(cpu).allocated;
  (void)pipe.step(x, y, mse);
  return {static_cast<double>(accel::memory_stats(cpu).peak_allocated - base) / static_cast<double>(activations),
          activations};
}

int memory(int micro_batches) {
  constexpr int width = 256, rows = 64;
  accel::count_cpu_memory();
  accelerator_t acc{accel::options{.cpu = true}};
  const int processes = acc.num_processes();
  const auto batch = accel_test::regression_batches(1, rows * micro_batches, width, width, 3).front();
  // What a step holds beside the activations (the weights' gradients computed before they are added, messages):
  // a step of one micro-batch holds one micro-batch's activations and that.
  const double beside = held_activations(acc, "gpipe", 1, batch, rows).first - 1;
  std::map<std::string, double> held;
  for (const std::string schedule : {"gpipe", "1f1b", "zero_bubble"}) {
    const auto [peak, activations] = held_activations(acc, schedule, micro_batches, batch, rows);
    held[schedule] = peak - beside;
    if (acc.process_index() == 0)
      std::printf(
          "pipeline_training: process 0 of %d, %s, %d micro-batches: %.2f micro-batches' activations held "
          "(one: %.2f MiB; %.2f beside them)\n",
          processes, schedule.c_str(), micro_batches, held[schedule], static_cast<double>(activations) / (1 << 20),
          beside);
  }
  std::fflush(stdout);
  // The first stage holds every micro-batch under GPipe, at most pp of them under 1F1B; under zero bubble at most pp
  // too, each one that waits for its weight pass holding its Linear layers' inputs and output gradients (twice).
  if (acc.process_index() == 0 && (held["gpipe"] < micro_batches - 0.5 || held["1f1b"] > processes + 0.5 ||
                                   held["zero_bubble"] > 2 * processes + 0.5))
    throw std::runtime_error(
        "the activations held are not the schedules' (GPipe m, 1F1B at most pp, zero bubble at most 2 pp)");
  return 0;
}

/// Steps [first, last) of training through `pipe`, each on its batch of `batches` (every tenth halved).
void run_steps(accel::pipeline& pipe, torch::optim::Optimizer& optimizer, const std::vector<accel_test::batch>& batches,
               int first, int last) {
  for (int step = first; step < last; ++step) {
    const auto [x, y] = every_tenth_halved(batches[static_cast<std::size_t>(step)], step);
    (void)pipe.step(x, y, mse);
    optimizer.step();
    optimizer.zero_grad();
  }
}

/// 20 steps of 1F1B then a save to `directory` (`save`), or a load from it (`load`), compared with one process.
int checkpoint(const std::string& mode, const std::string& directory) {
  constexpr int width = 32, rows = 16, steps = 20, micro_batches = 4;
  accelerator_t acc{accel::options{.cpu = true}};
  accel::pipeline pipe(acc, make_model(width), {.micro_batches = micro_batches});
  if (mode == "save") {
    torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(learning_rate));
    run_steps(pipe, optimizer, global_batches(steps, 1, rows, width), 0, steps);
    pipe.save_model(directory);
    return 0;
  }
  pipe.load_model(directory);
  auto reference = make_model(width);
  (void)train_in_one_process(reference, global_batches(steps, 1, rows, width), steps, 1, micro_batches, false);
  const double gap = distance(acc, pipe, reference);
  std::printf("pipeline_training: process %d of %d loaded %zu tensors, %.3g from one process\n", acc.process_index(),
              acc.num_processes(), pipe.module()->named_parameters().size(), gap);
  std::fflush(stdout);
  if (gap != 0) throw std::runtime_error("the loaded weights differ from one process's");
  return 0;
}

/// Under pp x tp: 20 steps of 1F1B, then `save_model` (the split layers gathered whole) to `directory`: loaded into a
/// fresh pipeline of the same layout (sliced again) it equals the trained one bit for bit, and loaded in one process
/// into the whole model it is within 1e-6 of one process's training.
int checkpoint_tp(const std::string& directory) {
  constexpr int width = 32, rows = 16, steps = 20, micro_batches = 4;
  tp_accelerator acc{accel::options{.cpu = true}};
  accel::pipeline pipe(acc, model_for(acc, width), {.micro_batches = micro_batches});
  torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(learning_rate));
  const auto batches = global_batches(steps, 1, rows, width);
  run_steps(pipe, optimizer, batches, 0, steps);
  pipe.save_model(directory);
  acc.wait_for_everyone();
  accel::pipeline loaded(acc, model_for(acc, width), {.micro_batches = micro_batches});
  loaded.load_model(directory);
  double reloaded = 0;
  for (std::size_t i = 0; i < pipe.parameters().size(); ++i)
    reloaded = std::max(reloaded, (loaded.parameters()[i] - pipe.parameters()[i]).abs().max().item<double>());
  auto whole = make_model(width);
  accel::load_model(*whole, directory);
  auto reference = make_model(width);
  (void)train_in_one_process(reference, batches, steps, 1, micro_batches, false);
  double from_one = 0;
  const auto expected = reference->named_parameters();
  for (const auto& named : whole->named_parameters())
    from_one = std::max(from_one, (named.value() - expected[named.key()]).abs().max().item<double>());
  std::printf(
      "pipeline_training: process %d (tp index %d): reloaded %.3g from the trained slices; the file %.3g from "
      "one process\n",
      acc.process_index(), index_along(acc, "tp"), reloaded, from_one);
  std::fflush(stdout);
  if (reloaded != 0 || from_one > 1e-6) throw std::runtime_error("pp x tp's weights did not save and load whole");
  return 0;
}

int metrics() {
  accelerator_t acc{accel::options{.cpu = true}};
  accel::pipeline pipe(acc, make_model(8), {.micro_batches = 2});
  const bool last_stage = pipe.local_stages().back() == pipe.stages() - 1;
  std::vector<at::Tensor> batches;
  // 5 batches, the last of one sample: on 2 data-parallel ranks, the last round completed with a duplicate of the first
  for (std::int64_t first = 0; first < 9; first += 2)
    batches.push_back(torch::arange(first, std::min<std::int64_t>(first + 2, 9), torch::kFloat));
  std::vector<at::Tensor> seen;
  for (auto&& batch : acc.prepare(batches)) seen.push_back(acc.gather_for_metrics(last_stage ? batch : -1 - batch));
  const auto all = torch::cat(seen);
  std::string listed;
  for (std::int64_t i = 0; i < all.size(0); ++i) listed += " " + std::to_string(all[i].item<int>());
  std::printf("pipeline_training: process %d (stage %d of %d) gathered%s\n", acc.process_index(),
              pipe.local_stages().back(), pipe.stages(), listed.c_str());
  std::fflush(stdout);
  if (!torch::equal(all, torch::arange(9, torch::kFloat)))
    throw std::runtime_error("gather_for_metrics did not give every sample once, from the last stage");
  return 0;
}

/// The loads `load_state` refuses, before anything changes: an optimizer whose state it does not hold (LBFGS), and a
/// directory that `save_model` wrote without it.
void refused_state(accel::pipeline& pipe, const std::string& directory) {
  const auto before = pipe.parameters().front().clone();
  std::string kind, missing;
  try {
    torch::optim::LBFGS lbfgs(pipe.parameters());
    pipe.load_state(directory, lbfgs);
  } catch (const std::invalid_argument& e) {
    kind = e.what();
  }
  try {
    torch::optim::SGD sgd(pipe.parameters(), torch::optim::SGDOptions(learning_rate));
    pipe.load_state(directory + "-absent", sgd);
  } catch (const accel::checkpoint_error& e) {
    missing = e.what();
  }
  if (kind.find("none of SGD, Adam, AdamW, Adagrad and RMSprop") == std::string::npos ||
      missing.find("pipe.save_state(directory, optimizer) writes it") == std::string::npos ||
      !torch::equal(before, pipe.parameters().front()))
    throw std::runtime_error("load_state did not refuse an LBFGS optimizer and a missing state by name:\n" + kind +
                             "\n" + missing);
}

/// `resume_save DIR`: 10 steps of 1F1B (4 micro-batches) with SGD and momentum, then `save_state`. `resume_load DIR`:
/// at this job's pp (another, or one process), `load_state` and 10 more steps: the parameters must equal one process
/// trained 20 steps straight, bit for bit, which they cannot without the momentum buffers restored (they end 0.03 to
/// 0.05 away). Under tp (`resume_save_tp`, `resume_load_tp`), or loading what tp saved (`resume_load_after_tp`),
/// within 1e-6: the split layers' all-reduces round otherwise.
template <class Accelerator>
int resume(const std::string& mode, const std::string& directory, double tolerance) {
  constexpr int width = 32, rows = 16, steps = 20, micro_batches = 4;
  constexpr double momentum = 0.9;
  Accelerator acc{accel::options{.cpu = true}};
  accel::pipeline pipe(acc, model_for(acc, width), {.micro_batches = micro_batches});
  torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(learning_rate).momentum(momentum));
  const auto batches = global_batches(steps, 1, rows, width);
  const bool saving = mode.starts_with("resume_save");
  if (!saving) {
    refused_state(pipe, directory);
    pipe.load_state(directory, optimizer);
  }
  run_steps(pipe, optimizer, batches, saving ? 0 : steps / 2, saving ? steps / 2 : steps);
  if (saving) {
    pipe.save_state(directory, optimizer);
    return 0;
  }
  auto reference = make_model(width);
  (void)train_in_one_process(reference, batches, steps, 1, micro_batches, false, false, momentum);
  const double gap = distance(acc, pipe, reference);
  std::printf("pipeline_training: process %d of %d resumed at step %d, %.3g from one process after %d steps\n",
              acc.process_index(), acc.num_processes(), steps / 2, gap, steps);
  std::fflush(stdout);
  if (gap > tolerance) throw std::runtime_error("the resumed training differs from one process's");
  return 0;
}

/// The names of `pipe`'s children.
std::vector<std::string> child_names(const accel::pipeline& pipe) {
  std::vector<std::string> names;
  for (const auto& child : pipe.module()->named_children()) names.push_back(child.key());
  return names;
}

/// The message `split_before` makes the pipeline throw, or "" when it throws none.
std::string refusal(accelerator_t& acc, const std::vector<std::string>& split_before) {
  try {
    accel::pipeline pipe(acc, make_model(8), {.split_before = split_before});
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

int split() {
  accelerator_t acc{accel::options{.cpu = true}};
  accel::pipeline pipe(acc, make_model(8), {.split_before = {"4"}});
  std::vector<std::string> expected;
  for (int child = acc.process_index() == 0 ? 0 : 4; child < (acc.process_index() == 0 ? 4 : 16); ++child)
    expected.push_back(std::to_string(child));
  if (child_names(pipe) != expected) throw std::runtime_error("split_before did not cut the model at child 4");
  const std::string unknown = refusal(acc, {"fc"}), first = refusal(acc, {"0"}), many = refusal(acc, {"4", "8"});
  std::printf("pipeline_training: process %d holds children %s to %s\n%s\n%s\n%s\n", acc.process_index(),
              expected.front().c_str(), expected.back().c_str(), unknown.c_str(), first.c_str(), many.c_str());
  std::fflush(stdout);
  if (unknown.find("\"fc\" is not a child of the model") == std::string::npos ||
      first.find("\"0\" is not a child of the model after the previous split") == std::string::npos ||
      many.find("split_before names 2 children but 2 stages need 1") == std::string::npos)
    throw std::runtime_error("a wrong split_before was not refused as it should be");
  return 0;
}

}  // namespace

int run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "train" && argc == 6)
    return train<accelerator_t>(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  if (mode == "train_fully_sharded" && argc == 6)
    return train<fully_sharded_accelerator>(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  if (mode == "train_hybrid_sharded" && argc == 6)
    return train<hybrid_sharded_accelerator>(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  if (mode == "train_tp" && argc == 6)
    return train<tp_accelerator>(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  if (mode == "checkpoint_tp" && argc == 3) return checkpoint_tp(argv[2]);
  if (mode == "train_bf16" && argc == 6)
    return train<bf16_accelerator>(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  if (mode == "memory" && argc == 3) return memory(std::atoi(argv[2]));
  if (mode == "split" && argc == 2) return split();
  if (mode == "metrics" && argc == 2) return metrics();
  if ((mode == "resume_save" || mode == "resume_load") && argc == 3) return resume<accelerator_t>(mode, argv[2], 0);
  if ((mode == "resume_save_tp" || mode == "resume_load_tp") && argc == 3)
    return resume<tp_accelerator>(mode, argv[2], 1e-6);
  if (mode == "resume_load_after_tp" && argc == 3) return resume<accelerator_t>(mode, argv[2], 1e-6);
  if ((mode == "save" || mode == "load") && argc == 3) return checkpoint(mode, argv[2]);
  std::fprintf(
      stderr,
      "usage: pipeline_training train|train_bf16 gpipe|1f1b|interleaved|zero_bubble STAGES_PER_PROCESS "
      "MICRO_BATCHES STEPS (also train_tp, train_fully_sharded, train_hybrid_sharded) | memory MICRO_BATCHES | "
      "save DIR | load DIR | checkpoint_tp DIR | resume_save[_tp] DIR | resume_load[_tp|_after_tp] DIR | "
      "split | metrics\n");
  return 2;
}

}  // namespace programs::pipeline_training
