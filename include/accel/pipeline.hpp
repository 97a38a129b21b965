/// \file
/// Pipeline parallelism for training: a `torch::nn::Sequential` cut into stages across the mesh's "pp" group
/// (`options::parallelism_config.pp_size`, PARALLELISM_CONFIG_PP_SIZE, `accel launch --parallelism_config_pp_size`),
/// each batch cut into micro-batches that flow through the stages by a schedule (accel/pipeline_schedule.hpp: GPipe,
/// 1F1B, interleaved 1F1B, zero bubble), as PyTorch's `torch.distributed.pipelining` does, on Gloo:
///
///     accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc({.parallelism_config = {.pp_size = 2}});
///     accel::pipeline pipe(acc, net, {.schedule = accel::pipeline_schedule::one_f_one_b, .micro_batches = 4});
///     torch::optim::SGD opt(pipe.parameters(), 0.1);
///     for (auto&& [x, y] : acc.prepare(loader)) {
///       auto loss = pipe.step(x, y, [](const at::Tensor& out, const at::Tensor& y) { return torch::mse_loss(out, y);
///       }); opt.step(); opt.zero_grad();
///     }
///
/// Stage s of the pp * `stages_per_process` stages runs on the pp group's process s % pp (looped, as PyTorch's
/// interleaved schedules place them). `module()` holds this process's stages' blocks under their names in the whole
/// model, so a checkpoint names each parameter as one process would. The loss of a micro-batch is the loss
/// function's value over it divided by the number of micro-batches (a mean-reduced loss gives the batch's mean); the
/// gradients accumulate over the micro-batches, and `step` returns the batch's loss on every process. With
/// dp_replicate above 1 beside pp, the stages' copies average their gradients over their "dp" group at the end of the
/// step. With dp_shard above 1 (pp x dp_shard, and with dp_replicate pp x HSDP), each stage's parameters are cut
/// across the dp_shard group as FSDP cuts them: `parameters()` are this process's shards, which the optimizer is
/// built over; a step gathers the whole parameters, and at its end reduce-scatters the gradients into the shards'
/// and frees the whole parameters again. With tp above 1 (pp x tp, and with dp_replicate), the stages' layers are
/// those `accel::parallelize_module` split under `tensor_parallel<gloo>`: each stage's forward runs with the split
/// layers routed, the processes of one tp index forming a pipeline. The pipeline's module is not given to
/// `acc.prepare`: the pipeline is what places and synchronises it, and runs it in the accelerator's precision: fp32, or
/// bf16 (each stage's forward under autocast, the last stage's output in float32 before the loss, as a prepared
/// model's); fp16 and fp8 do not compile with it yet.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "detail/config.hpp"
#include "detail/pipeline/links.hpp"
#include "pipeline_schedule.hpp"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace accel {

/// How a model is cut and run (PyTorch's `PipelineStage` / `Schedule*` arguments).
struct pipeline_options {
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;
  /// Each batch is cut into this many equal micro-batches along its first dimension.
  int micro_batches = 1;
  /// Stages on each process: 1, or more for the looped schedules (interleaved 1F1B, GPipe).
  int stages_per_process = 1;
  /// Names of the model's children that begin a stage after the first (PyTorch's `SplitPoint.BEGINNING`): one fewer
  /// than the stages. Empty: the children are cut into stages of equal count, the first stages one more.
  std::vector<std::string> split_before{};
};

/// Where this process's time went in a step's schedule (from its first action to the end of its sends): the wall
/// time, and the part spent computing (forward and backward actions). The rest it waited for messages: the pipeline's
/// bubble, and what moving the messages costs beyond it.
struct pipeline_timing {
  double seconds = 0;
  double computing = 0;
  /// This process's mean time per compute action of each kind (0 for a kind it did not run; a whole backward counts
  /// as backward_input): what `simulate_pipeline` takes to predict the bubble of stages that cost as these did.
  pipeline_costs costs{.forward = 0, .backward_input = 0, .backward_weight = 0};
  /// The share of the schedule spent waiting, which `pipeline_bubble_formula` predicts for stages of equal cost
  /// and free messages.
  [[nodiscard]] double bubble() const noexcept { return seconds > 0 ? 1 - computing / seconds : 0; }
};

/// A model cut into pipeline stages on this process's "pp" group (see the file comment).
class pipeline {
 public:
  using loss_function = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

  /// Cuts `model` (the whole model, the same on every process) into stages and keeps this process's, placed on
  /// `acc`'s device. Every process of the job constructs it at the same point. Throws std::invalid_argument for
  /// options that cannot cut this model (the message names the fix) and `accel::mesh_error` for a mesh it cannot run.
  template <class Accelerator>
  pipeline(Accelerator& acc, const torch::nn::Sequential& model, pipeline_options how)
      : pipeline(model, std::move(how), detail::pp::links_of(acc), acc.device()) {}

  /// One batch through every stage, forward and backward, micro-batch by micro-batch in the schedule's order;
  /// the gradients of this process's parameters accumulate (then average over dp replicas). Returns the batch's
  /// loss (the mean of the micro-batches' losses) on every process. `input` goes to the first stage and `target`
  /// to the loss after the last; each is cut along dimension 0. An `input` that requires grad gets its gradient on
  /// the first stage's process, under every schedule, as a plain backward gives it.
  ACCEL_DECL at::Tensor step(const at::Tensor& input, const at::Tensor& target, const loss_function& loss);

  /// Writes the whole model's weights (`accel::save_model`'s files: model.safetensors) from the first process of the
  /// first replica's pp group (of tp index 0), where every stage's parameters and buffers are gathered first. Every
  /// process calls it; on that pp group it returns once the files are written or throws on all of its processes; the
  /// other replicas, which hold the same weights, return at once.
  ACCEL_DECL void save_model(const std::filesystem::path& directory);
  /// Loads weights of the whole model (what `save_model` wrote, at any pp, or `accel::save_model` of the whole model
  /// in one process) into this process's stages, checking every name, shape and dtype first (`accel::load_model`).
  ACCEL_DECL void load_model(const std::filesystem::path& where);
  /// `save_model`, and the state `optimizer` (one over `parameters()`: SGD, Adam, AdamW, Adagrad or RMSprop) keeps
  /// for each parameter (momentum, moments, step counts) in `pipeline_optimizer.pt`, gathered the same way under the
  /// whole model's parameter names: `load_state` restores both at any pp, one process included, so that training
  /// resumes where it stopped. The optimizer's options (learning rate, ...) are what it is constructed with. Under tp
  /// the split layers' state is gathered whole into `optimizer` while it is written, and put back after.
  ACCEL_DECL void save_state(const std::filesystem::path& directory, torch::optim::Optimizer& optimizer);
  /// Loads what `save_state` wrote into this process's stages and `optimizer`'s state for their parameters, checking
  /// the weights first (`load_model`); throws std::invalid_argument for an optimizer of another kind.
  ACCEL_DECL void load_state(const std::filesystem::path& directory, torch::optim::Optimizer& optimizer);

  /// This process's stages' blocks, each under its name in the whole model. Under dp_shard its parameters are
  /// empty between steps (`parameters()` holds them).
  [[nodiscard]] const torch::nn::Sequential& module() const noexcept { return module_; }
  /// What the optimizer updates: the module's parameters, or under dp_shard this process's shard of each (its
  /// `shards()`-th part of the flattened parameter, zero-padded to a multiple of `shards()`), in the same order.
  [[nodiscard]] std::vector<at::Tensor> parameters() const { return shards_.empty() ? module_->parameters() : shards_; }
  /// The dp_shard group's size: 1 when the parameters are whole.
  [[nodiscard]] int shards() const noexcept { return links_.shards; }
  /// The stages this process runs, in order, and the total.
  [[nodiscard]] const std::vector<int>& local_stages() const noexcept { return local_stages_; }
  [[nodiscard]] int stages() const noexcept { return shape_.stages; }
  /// This process's actions in each step.
  [[nodiscard]] const std::vector<pipeline_action>& actions() const noexcept { return actions_; }
  /// How the last `step`'s schedule spent this process's time.
  [[nodiscard]] const pipeline_timing& last_step_timing() const noexcept { return timing_; }

 private:
  struct step_state;  // one step's micro-batches: inputs, outputs, received tensors, sends in flight
  /// Where a stage's input gradient goes: nowhere (the input needs none), to the previous stage, or on the first
  /// stage into the caller's input.
  enum class input_gradient_use : std::uint8_t { none, previous_stage, callers_input };

  ACCEL_DECL pipeline(const torch::nn::Sequential& model, pipeline_options how, detail::pp::links links,
                      c10::Device device);
  /// Whether this process's pp group writes the checkpoint files: the first data-parallel replica's, of tp index 0
  /// (the others hold the same weights and state, whole).
  [[nodiscard]] ACCEL_DECL bool writes_checkpoints() const noexcept;
  /// save_model's writing, once the parameters are whole: the stages gathered on the pp group's first process.
  ACCEL_DECL void write_model(const std::filesystem::path& directory);
  /// save_state's writing, once the optimizer's state is whole.
  ACCEL_DECL void write_state(const std::filesystem::path& directory, const torch::optim::Optimizer& optimizer);
  ACCEL_DECL void average_over_replicas();
  /// Zero bubble's weight pass computed from each Linear's input and output gradient (`dW = dY^T X`), not by a
  /// second pass over the stage's graph: where every stage's parameters are Linear layers' (fp32, no tp).
  [[nodiscard]] ACCEL_DECL bool weights_split_by_hand() const;
  [[nodiscard]] ACCEL_DECL at::Tensor forward_recording(int stage, const at::Tensor& input,
                                                        std::vector<detail::pp::linear_pass>& linears);
  ACCEL_DECL void input_pass(std::size_t local, std::size_t mb, input_gradient_use use,
                             const std::vector<at::Tensor>& root_gradient, step_state& state);
  ACCEL_DECL static void deliver_input_gradient(input_gradient_use use, at::Tensor gradient, std::size_t local,
                                                std::size_t mb, step_state& state);
  /// The first stage's input gradients, micro-batch by micro-batch, into the caller's input: one backward.
  ACCEL_DECL static void backward_into_callers_input(const at::Tensor& input, step_state& state);
  ACCEL_DECL static void weight_pass(std::vector<detail::pp::linear_pass>& linears);
  /// Under dp_shard: the whole parameters gathered from the shards (`unshard`); the gradients summed into the shards'
  /// and averaged, the whole parameters' cleared (`reduce_gradients_into_shards`); each shard set from its whole
  /// parameter, which is then freed (`reshard`).
  ACCEL_DECL void make_shards();
  ACCEL_DECL void unshard();
  ACCEL_DECL void reduce_gradients_into_shards();
  ACCEL_DECL void reshard();
  /// The whole parameters until the returned object goes (save and load): under dp_shard unshard() now and
  /// reshard() then, which also cuts the shards from what a load put there; nothing otherwise.
  [[nodiscard]] ACCEL_DECL std::shared_ptr<void> whole_parameters();
  /// Under dp_shard: the optimizer's state of each local parameter whole, serialized, by parameter (a collective of
  /// the dp_shard group); a whole parameter's state, as `load_state` reads it, cut to its shard `index`'s.
  [[nodiscard]] ACCEL_DECL std::map<const void*, std::vector<char>> whole_states(
      const torch::optim::Optimizer& optimizer);
  ACCEL_DECL void cut_to_shard(torch::optim::OptimizerParamState& state, std::size_t index) const;
  /// A local parameter's shard `index`, whole: gathered over the dp_shard group (a collective).
  [[nodiscard]] ACCEL_DECL at::Tensor gathered(const at::Tensor& shard, std::size_t index) const;
  ACCEL_DECL void run(const pipeline_action& action, step_state& state, const loss_function& loss);
  ACCEL_DECL void forward(int stage, int micro_batch, step_state& state, const loss_function& loss);
  ACCEL_DECL void backward(const pipeline_action& action, step_state& state);
  ACCEL_DECL void transfer(const pipeline_action& action, step_state& state);
  ACCEL_DECL void send(const pipeline_action& action, step_state& state);
  ACCEL_DECL void receive(const pipeline_action& action, step_state& state);
  /// Posts the receives from action `first` to the next compute action (which needs them), when their shapes are
  /// known (the batch's shape is the last step's): called as the compute action before them starts, so that each
  /// message travels as soon as it is sent.
  ACCEL_DECL void post_receives_from(std::size_t first, step_state& state);
  [[nodiscard]] ACCEL_DECL torch::nn::Sequential& stage_module(int stage);
  /// Stage `stage`'s parameters, then its buffers, in the whole model (whichever process runs it).
  [[nodiscard]] ACCEL_DECL std::vector<at::Tensor> stage_tensors(int stage) const;
  /// Stage `stage`'s parameters under their names in the whole model.
  [[nodiscard]] ACCEL_DECL std::vector<std::pair<std::string, at::Tensor>> stage_parameters(int stage) const;
  /// `optimizer`'s state of `parameter`, serialized (empty: it has none yet).
  [[nodiscard]] ACCEL_DECL static std::vector<char> state_bytes(const torch::optim::Optimizer& optimizer,
                                                                const at::Tensor& parameter);
  /// On the pp group's first process, `bytes` from `owner` under message `tag` (its own when it is the owner).
  ACCEL_DECL std::vector<char> gather_bytes(std::vector<char> bytes, int owner, int tag);
  /// Raises `failure` (or a message naming `what`) on every process of the pp group when its first process failed.
  ACCEL_DECL void agree_written(const std::string& failure, const std::string& what);

  pipeline_options how_;
  pipeline_shape shape_;
  detail::pp::links links_;
  torch::nn::Sequential whole_;      // the model given, whose stages other processes run: where save_model gathers
  std::vector<std::size_t> bounds_;  // stage s is whole_'s children [bounds_[s], bounds_[s + 1])
  torch::nn::Sequential module_;
  std::vector<torch::nn::Sequential> stage_modules_;  // by local index, as local_stages_
  std::vector<int> local_stages_;
  std::vector<pipeline_action> actions_;
  // Each message's shape, by tag / 2, learnt from the headers of a step whose batch had the shape known_* records:
  // a step whose batch has that shape sends no headers (every process sees the same batch, so all agree).
  std::vector<detail::pp::message_shape> message_shapes_;
  std::vector<std::int64_t> known_input_, known_target_;
  // Under dp_shard: this process's shard of each local parameter, and where each lies in the step's flat buffers.
  std::vector<at::Tensor> shards_;
  std::vector<std::int64_t> shard_offsets_;
  std::vector<std::vector<std::int64_t>> whole_sizes_;
  bool split_weights_ = false;  // weights_split_by_hand()
  pipeline_timing timing_;
};

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/pipeline.ipp"
#endif
