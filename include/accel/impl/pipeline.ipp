/// \file
/// What pipeline.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../pipeline.hpp"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/utils/tensor_flatten.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "../checkpoint_error.hpp"
#include "../detail/compat.hpp"
#include "../detail/support/atomic_file.hpp"
#include "../detail/support/optimizer_state.hpp"
#include "../model_weights.hpp"

namespace accel::detail::pp {

/// A message's header: its dtype, rank and sizes, so that the receiver can allocate it (activations of any shape).
inline constexpr std::int64_t header_length = 10;

/// Where children [begin[s], begin[s+1]) of a model of `children` children make stage s.
ACCEL_DECL std::vector<std::size_t> stage_bounds(const std::vector<std::string>& children, int stages,
                                                 const std::vector<std::string>& split_before) {
  const auto count = static_cast<std::size_t>(stages);
  std::vector<std::size_t> begin{0};
  if (split_before.empty()) {
    if (children.size() < count)
      throw std::invalid_argument("accel::pipeline: the model has " + std::to_string(children.size()) +
                                  " children but the pipeline has " + std::to_string(stages) +
                                  " stages (pp_size x stages_per_process); give it at least one child per stage");
    for (std::size_t s = 1; s < count; ++s)
      begin.push_back(begin.back() + children.size() / count + (s - 1 < children.size() % count ? 1 : 0));
  } else {
    if (split_before.size() != count - 1)
      throw std::invalid_argument("accel::pipeline: split_before names " + std::to_string(split_before.size()) +
                                  " children but " + std::to_string(stages) + " stages need " +
                                  std::to_string(count - 1) + " (the first child of every stage but the first)");
    for (const auto& name : split_before) {
      const auto at = std::find(children.begin(), children.end(), name);
      const auto index = static_cast<std::size_t>(at - children.begin());
      if (at == children.end() || index <= begin.back())
        throw std::invalid_argument("accel::pipeline: split_before's \"" + name +
                                    "\" is not a child of the model after the previous split; name the model's "
                                    "children (named_children()) in their order, the first one excluded");
      begin.push_back(index);
    }
  }
  begin.push_back(children.size());
  return begin;
}

/// The header's tag of the activation (`gradient` false) or gradient sent to `stage` for `micro_batch`, its data's
/// the next: tags of their own for every message of a step, so that messages meet by tag, whatever order they travel
/// in. Even, so that tag / 2 numbers the messages.
inline int message_tag(bool gradient, int stage, int micro_batch, const pipeline_shape& shape) {
  return (((gradient ? 1 : 0) * shape.stages + stage) * shape.micro_batches + micro_batch) * 2;
}

/// The message a receive action takes: its header's tag and the process that sends it.
struct incoming {
  int tag;
  int peer;
};

inline incoming incoming_for(const pipeline_action& action, const pipeline_shape& shape) {
  const bool gradient = action.op == pipeline_op::receive_gradient;
  return {message_tag(gradient, action.stage, action.micro_batch, shape),
          shape.process_of(gradient ? action.stage + 1 : action.stage - 1)};
}

/// A receive posted before its action, so that the message travels as soon as it is sent.
struct posted_receive {
  std::function<void()> received;
  at::Tensor data;
};

inline bool computes(const pipeline_action& action) {
  return action.op == pipeline_op::forward || action.op == pipeline_op::backward ||
         action.op == pipeline_op::backward_input || action.op == pipeline_op::backward_weight;
}

/// A step's compute time, in all and by kind of action.
class compute_clock {
 public:
  void add(pipeline_op op, std::chrono::steady_clock::duration spent) {
    const auto kind = op == pipeline_op::forward ? 0 : op == pipeline_op::backward_weight ? 2 : 1;
    spent_[kind] += spent;
    ++count_[kind];
  }
  [[nodiscard]] pipeline_timing timing(std::chrono::steady_clock::duration span) const {
    const auto mean = [&](int kind) { return count_[kind] ? seconds(spent_[kind]) / count_[kind] : 0.0; };
    return {.seconds = seconds(span),
            .computing = seconds(spent_[0] + spent_[1] + spent_[2]),
            .costs = {.forward = mean(0), .backward_input = mean(1), .backward_weight = mean(2)}};
  }

 private:
  static double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }
  std::array<std::chrono::steady_clock::duration, 3> spent_{};  // forward, backward (or its input part), weight
  std::array<int, 3> count_{};
};

/// A message being sent, and its buffers, which must live until it is.
struct in_flight {
  std::function<void()> header_sent, data_sent;
  at::Tensor header, data;
};

/// A shard's length: a parameter of `numel` elements cut into `shards` equal parts, the last zero-padded.
inline std::int64_t shard_length(std::int64_t numel, int shards) { return (numel + shards - 1) / shards; }

/// A parameter's optimizer state, serialized as a pipeline checkpoint holds it.
inline std::vector<char> serialized(const torch::optim::OptimizerParamState& state) {
  torch::serialize::OutputArchive archive;
  state.serialize(archive);
  std::ostringstream out;
  archive.save_to(out);
  const auto text = out.str();
  return {text.begin(), text.end()};
}

/// The index of `parameter` among `parameters` (the same tensor).
inline std::size_t index_of(const std::vector<at::Tensor>& parameters, const at::Tensor& parameter) {
  return static_cast<std::size_t>(std::find_if(parameters.begin(), parameters.end(),
                                               [&](const at::Tensor& each) {
                                                 return each.unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl();
                                               }) -
                                  parameters.begin());
}

/// A Linear layer's forward in a stage whose weight gradients zero bubble's weight pass computes itself: the layer's
/// input, its output, and the output's gradient once the input pass has computed it.
struct linear_pass {
  torch::nn::LinearImpl* layer;
  at::Tensor input, output, output_gradient;
};

/// Adds `gradient` to `parameter`'s, as autograd accumulates it; a first one is copied, so that no gradient shares
/// another tensor's storage.
inline void accumulate_gradient(const at::Tensor& parameter, const at::Tensor& gradient) {
  auto& held = parameter.mutable_grad();
  if (held.defined())
    held.add_(gradient);
  else
    held = gradient.clone(at::MemoryFormat::Contiguous);
}

inline void finish(in_flight& send) {
  if (send.header_sent) std::exchange(send.header_sent, {})();
  if (send.data_sent) std::exchange(send.data_sent, {})();
  send = {};
}

}  // namespace accel::detail::pp

namespace accel {

struct pipeline::step_state {
  // The micro-batches. Those of an input that requires grad are leaves of their own: autograd through the split
  // would build the whole input's gradient for each micro-batch (m times the work of one backward through it).
  std::vector<at::Tensor> inputs, targets;
  std::vector<at::Tensor> callers_input_gradient;  // by micro-batch, on the first stage's process
  // By local stage, then micro-batch:
  std::vector<std::vector<at::Tensor>> stage_input;      // received, or the previous local stage's output detached
  std::vector<std::vector<at::Tensor>> stage_output;     // the output, or the loss after the last stage
  std::vector<std::vector<at::Tensor>> output_gradient;  // received, or the next local stage's input gradient
  std::vector<std::vector<at::Tensor>> input_gradient;   // to send to the previous stage
  // Sends in flight, by tag: an activation's is waited for (done by then) and its buffer freed when its gradient
  // comes back; the others at the end of the step.
  std::map<int, detail::pp::in_flight> sends;
  std::map<int, detail::pp::posted_receive> receives;  // by tag, posted ahead of their receive actions
  bool headers = true;  // whether each message is preceded by its shape (the batch's shape is new)
  at::Tensor loss_sum;
  // By local stage, then micro-batch, when the weight pass is split by hand (split_weights_): each Linear's pass.
  std::vector<std::vector<std::vector<detail::pp::linear_pass>>> linears;
};

pipeline::pipeline(const torch::nn::Sequential& model, pipeline_options how, detail::pp::links links,
                   c10::Device device)
    : how_(std::move(how)),
      shape_{
          .stages = links.size * how_.stages_per_process, .micro_batches = how_.micro_batches, .processes = links.size},
      links_(std::move(links)),
      whole_(model) {
  if (how_.micro_batches < 1 || how_.stages_per_process < 1)
    throw std::invalid_argument("accel::pipeline: micro_batches and stages_per_process must be at least 1");
  std::vector<std::string> names;
  for (const auto& child : model->named_children()) names.push_back(child.key());
  bounds_ = detail::pp::stage_bounds(names, shape_.stages, how_.split_before);
  for (int stage = links_.rank; stage < shape_.stages; stage += shape_.processes) {
    torch::nn::Sequential part;
    for (auto child = bounds_[static_cast<std::size_t>(stage)]; child < bounds_[static_cast<std::size_t>(stage) + 1];
         ++child) {
      const auto& any = *(model->begin() + static_cast<std::ptrdiff_t>(child));
      part->push_back(names[child], any);
      module_->push_back(names[child], any);
    }
    stage_modules_.push_back(std::move(part));
    local_stages_.push_back(stage);
  }
  module_->to(device);
  actions_ = make_pipeline_schedule(how_.schedule, shape_).at(static_cast<std::size_t>(links_.rank));
  message_shapes_.resize(static_cast<std::size_t>(2 * shape_.stages * shape_.micro_batches));
  if (links_.shards > 1) make_shards();
  split_weights_ = weights_split_by_hand();
}

bool pipeline::weights_split_by_hand() const {
  // Autocast computes in another dtype than the weights', and tp's split layers are routed: autograd's pass there.
  if (how_.schedule != pipeline_schedule::zero_bubble || links_.tp > 1 || links_.float_output) return false;
  for (const auto& stage : stage_modules_)
    for (const auto& child : *stage) {
      const auto* linear = child.ptr()->as<torch::nn::LinearImpl>();
      if (linear == nullptr && !child.ptr()->parameters().empty()) return false;
      if (linear != nullptr)
        for (const auto& parameter : linear->parameters())
          if (!parameter.requires_grad()) return false;
    }
  return true;
}

at::Tensor pipeline::forward_recording(int stage, const at::Tensor& input,
                                       std::vector<detail::pp::linear_pass>& linears) {
  at::Tensor current = input;
  for (auto& child : *stage_module(stage)) {
    auto* linear = child.ptr()->as<torch::nn::LinearImpl>();
    at::Tensor output = child.forward(current);
    if (linear != nullptr) linears.push_back({linear, current.detach(), output, {}});
    current = std::move(output);
  }
  return current;
}

void pipeline::input_pass(std::size_t local, std::size_t mb, input_gradient_use use,
                          const std::vector<at::Tensor>& root_gradient, step_state& state) {
  auto& linears = state.linears[local][mb];
  auto& input = state.stage_input[local][mb];
  std::vector<at::Tensor> targets;
  for (const auto& pass : linears) targets.push_back(pass.output);
  if (use != input_gradient_use::none) targets.push_back(input);
  // Each Linear's output gradient and the input's, and nothing of the weights': the weight pass computes those
  // from them, without a second pass over the graph, which is freed here.
  const auto gradients =
      targets.empty() ? std::vector<at::Tensor>{}  // a first stage without parameters: nothing to compute
                      : torch::autograd::grad({state.stage_output[local][mb]}, targets, root_gradient,
                                              /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  for (std::size_t i = 0; i < linears.size(); ++i) {
    linears[i].output_gradient = gradients[i];
    linears[i].output = at::Tensor();
  }
  if (use != input_gradient_use::none) deliver_input_gradient(use, gradients.back(), local, mb, state);
  state.stage_output[local][mb] = at::Tensor();
  input = at::Tensor();
  state.output_gradient[local][mb] = at::Tensor();
}

void pipeline::deliver_input_gradient(input_gradient_use use, at::Tensor gradient, std::size_t local, std::size_t mb,
                                      step_state& state) {
  if (use == input_gradient_use::previous_stage)
    state.input_gradient[local][mb] = std::move(gradient);
  else if (use == input_gradient_use::callers_input)  // into the caller's input at the step's end
    state.callers_input_gradient[mb] = std::move(gradient);
}

void pipeline::backward_into_callers_input(const at::Tensor& input, step_state& state) {
  auto& pieces = state.callers_input_gradient;
  if (std::none_of(pieces.begin(), pieces.end(), [](const at::Tensor& piece) { return piece.defined(); }))
    return;  // not the first stage's process, or no micro-batch's loss reached the input
  for (std::size_t mb = 0; mb < pieces.size(); ++mb)
    if (!pieces[mb].defined()) pieces[mb] = at::zeros_like(state.inputs[mb]);
  // One backward, as one process's: it accumulates into input.grad, or goes on through the graph that made input.
  torch::autograd::backward({input}, {at::cat(pieces)});
}

void pipeline::weight_pass(std::vector<detail::pp::linear_pass>& linears) {
  at::NoGradGuard no_grad;
  for (auto& pass : linears) {
    if (!pass.output_gradient.defined()) continue;  // the output did not reach the loss
    const auto gradient = pass.output_gradient.reshape({-1, pass.output_gradient.size(-1)});
    const auto input = pass.input.reshape({-1, pass.input.size(-1)});
    // dW = dY^T X, computed into the weight gradient's own layout: a transposed product added to it would be a
    // strided pass over the whole matrix per micro-batch.
    auto& weight_gradient = pass.layer->weight.mutable_grad();
    if (weight_gradient.defined())
      weight_gradient.addmm_(gradient.t(), input);
    else
      weight_gradient = at::mm(gradient.t(), input);
    if (pass.layer->bias.defined()) detail::pp::accumulate_gradient(pass.layer->bias, gradient.sum(0));
  }
  linears.clear();
}

void pipeline::make_shards() {
  std::int64_t offset = 0;
  const auto parameters = module_->parameters();
  for (const auto& parameter : parameters) {
    if (parameter.scalar_type() != parameters.front().scalar_type())
      throw std::invalid_argument(
          "accel::pipeline: under dp_shard the stages' parameters are gathered and reduced in one flat buffer, so "
          "they must share one dtype; convert the model to one (model->to(torch::kFloat)) before cutting it");
    const auto length = detail::pp::shard_length(parameter.numel(), links_.shards);
    auto shard = at::zeros({length}, parameter.options());
    shard.requires_grad_(true);
    shards_.push_back(std::move(shard));
    shard_offsets_.push_back(offset);
    whole_sizes_.push_back(parameter.sizes().vec());
    offset += length;
  }
  reshard();
}

std::shared_ptr<void> pipeline::whole_parameters() {
  if (shards_.empty()) return nullptr;
  unshard();
  return {nullptr, [this](void*) { reshard(); }};  // local work only: safe while an error unwinds
}

void pipeline::unshard() {
  if (shards_.empty()) return;  // every member of the dp_shard group runs the same stages
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> mine_parts;
  for (const auto& shard : shards_) mine_parts.push_back(shard.detach());
  auto mine = at::cat(mine_parts);
  auto whole = at::empty({links_.shards, mine.numel()}, mine.options());
  auto flat = whole.view({-1});
  links_.all_gather_shards(flat, mine);
  const auto parameters = module_->parameters();
  for (std::size_t i = 0; i < shards_.size(); ++i) {
    const auto& sizes = whole_sizes_[i];
    const auto numel = c10::multiply_integers(sizes);
    parameters[i].set_data(
        whole.narrow(1, shard_offsets_[i], shards_[i].numel()).reshape({-1}).narrow(0, 0, numel).view(sizes));
  }
}

void pipeline::reduce_gradients_into_shards() {
  if (shards_.empty()) return;
  at::NoGradGuard no_grad;
  const auto total = shard_offsets_.back() + shards_.back().numel();
  auto whole = at::zeros({links_.shards, total}, shards_.front().options());
  const auto parameters = module_->parameters();
  for (std::size_t i = 0; i < shards_.size(); ++i) {
    auto& grad = parameters[i].mutable_grad();
    if (!grad.defined()) continue;  // unused in this step: zeros, as every peer's
    const auto length = shards_[i].numel();
    auto padded = at::zeros({links_.shards * length}, grad.options());
    padded.narrow(0, 0, grad.numel()).copy_(grad.reshape({-1}));
    whole.narrow(1, shard_offsets_[i], length).copy_(padded.view({links_.shards, length}));
    grad = at::Tensor();
  }
  auto mine = at::empty({total}, whole.options());
  auto flat = whole.view({-1});
  links_.reduce_scatter_shards(flat, mine);
  if (links_.sum_over_replicas) links_.sum_over_replicas(mine);
  mine.div_(links_.replicas);
  // Accumulated over steps without zero_grad, as the whole parameters' gradients would be.
  for (std::size_t i = 0; i < shards_.size(); ++i)
    detail::pp::accumulate_gradient(shards_[i], mine.narrow(0, shard_offsets_[i], shards_[i].numel()));
}

void pipeline::reshard() {
  at::NoGradGuard no_grad;
  const auto parameters = module_->parameters();
  for (std::size_t i = 0; i < shards_.size(); ++i) {
    const auto flat = parameters[i].detach().reshape({-1});
    const auto length = shards_[i].numel();
    const auto begin = std::min<std::int64_t>(links_.shard_index * length, flat.numel());
    const auto count = std::min<std::int64_t>(begin + length, flat.numel()) - begin;
    auto shard = shards_[i].detach();
    shard.narrow(0, count, length - count).zero_();  // the padding
    shard.narrow(0, 0, count).copy_(flat.narrow(0, begin, count));
    parameters[i].set_data(at::empty({0}, parameters[i].options()));
  }
}

at::Tensor pipeline::gathered(const at::Tensor& shard, std::size_t index) const {
  auto mine = shard.detach().contiguous();
  auto whole = at::empty({links_.shards * mine.numel()}, mine.options());
  links_.all_gather_shards(whole, mine);
  const auto& sizes = whole_sizes_[index];
  return whole.narrow(0, 0, c10::multiply_integers(sizes)).view(sizes).clone();
}

std::map<const void*, std::vector<char>> pipeline::whole_states(const torch::optim::Optimizer& optimizer) {
  std::map<const void*, std::vector<char>> states;
  const auto parameters = module_->parameters();
  for (std::size_t i = 0; i < shards_.size(); ++i) {
    const auto found = optimizer.state().find(detail::compat::optimizer_state_key(shards_[i]));
    if (found == optimizer.state().end()) continue;  // the dp_shard group steps every shard of a parameter alike
    auto whole = found->second->clone();
    if (!detail::transform_state_tensors(*whole, [&](const at::Tensor& part) { return gathered(part, i); }))
      throw std::invalid_argument(
          "accel::pipeline::save_state: the optimizer is none of SGD, Adam, AdamW, Adagrad and RMSprop, whose "
          "per-parameter state a pipeline cut over dp_shard gathers; use one of them, or save the weights alone "
          "(save_model)");
    states[parameters[i].unsafeGetTensorImpl()] = detail::pp::serialized(*whole);
  }
  return states;
}

void pipeline::cut_to_shard(torch::optim::OptimizerParamState& state, std::size_t index) const {
  const auto length = shards_[index].numel();
  detail::transform_state_tensors(state, [&](const at::Tensor& whole) {
    auto padded = at::zeros({links_.shards * length}, whole.options());
    padded.narrow(0, 0, whole.numel()).copy_(whole.reshape({-1}));
    return padded.narrow(0, links_.shard_index * length, length).clone();
  });
}

torch::nn::Sequential& pipeline::stage_module(int stage) {
  return stage_modules_[static_cast<std::size_t>(stage / shape_.processes)];
}

std::vector<at::Tensor> pipeline::stage_tensors(int stage) const {
  const auto children = whole_->children();
  std::vector<at::Tensor> tensors;
  for (auto child = bounds_[static_cast<std::size_t>(stage)]; child < bounds_[static_cast<std::size_t>(stage) + 1];
       ++child) {
    for (const auto& parameter : children[child]->parameters()) tensors.push_back(parameter);
    for (const auto& buffer : children[child]->buffers()) tensors.push_back(buffer);
  }
  return tensors;
}

void pipeline::save_model(const std::filesystem::path& directory) {
  const auto whole = whole_parameters();
  links_.with_whole_layers(*whole_, [&] { write_model(directory); });
}

bool pipeline::writes_checkpoints() const noexcept { return links_.replica_index == 0 && links_.tp_index == 0; }

void pipeline::write_model(const std::filesystem::path& directory) {
  if (!writes_checkpoints()) return;
  constexpr int first_tag = 1 << 28;  // above every step's tags
  int tag = first_tag;
  std::vector<std::function<void()>> pending;
  std::vector<at::Tensor> sent;
  for (int stage = 0; stage < shape_.stages; ++stage) {
    const int owner = shape_.process_of(stage);
    for (const auto& tensor : stage_tensors(stage)) {
      ++tag;
      if (owner == 0 || (links_.rank != owner && links_.rank != 0)) continue;
      if (links_.rank == owner) {
        sent.push_back(tensor.detach().contiguous());
        pending.push_back(links_.send(sent.back(), 0, tag));
      } else {
        auto received = at::empty(tensor.sizes(), tensor.options());
        links_.receive(received, owner, tag)();
        tensor.detach().copy_(received);
      }
    }
  }
  for (auto& wait : pending) wait();
  std::string failure;
  if (links_.rank == 0) try {
      accel::save_model(*whole_, directory);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  agree_written(failure,
                "accel::pipeline::save_model: the pp group's first process could not write " + directory.string());
}

void pipeline::agree_written(const std::string& failure, const std::string& what) {
  // The writer says whether it wrote, so that a failure is raised on every process of its group.
  auto written = at::full({}, failure.empty() ? 1.0F : 0.0F, at::kFloat);
  if (links_.size > 1) links_.broadcast(written, 0);
  if (written.item<float>() == 0)
    throw checkpoint_error(failure.empty() ? what + " (its own error says why)" : failure);
}

std::vector<std::pair<std::string, at::Tensor>> pipeline::stage_parameters(int stage) const {
  const auto children = whole_->named_children();
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (auto child = bounds_[static_cast<std::size_t>(stage)]; child < bounds_[static_cast<std::size_t>(stage) + 1];
       ++child)
    for (const auto& parameter : children[child].value()->named_parameters())
      named.emplace_back(children[child].key() + "." + parameter.key(), parameter.value());
  return named;
}

std::vector<char> pipeline::state_bytes(const torch::optim::Optimizer& optimizer, const at::Tensor& parameter) {
  const auto found = optimizer.state().find(detail::compat::optimizer_state_key(parameter));
  if (found == optimizer.state().end()) return {};
  return detail::pp::serialized(*found->second);
}

std::vector<char> pipeline::gather_bytes(std::vector<char> bytes, int owner, int tag) {
  if (owner == 0) return links_.rank == 0 ? bytes : std::vector<char>{};
  if (links_.rank == owner) {
    auto size = at::full({1}, static_cast<std::int64_t>(bytes.size()), at::kLong);
    links_.send(size, 0, tag)();
    if (!bytes.empty()) {
      auto data = at::from_blob(bytes.data(), {static_cast<std::int64_t>(bytes.size())}, at::kByte).clone();
      links_.send(data, 0, tag + 1)();
    }
    return {};
  }
  if (links_.rank != 0) return {};
  auto size = at::empty({1}, at::kLong);
  links_.receive(size, owner, tag)();
  std::vector<char> received(static_cast<std::size_t>(size.item<std::int64_t>()));
  if (!received.empty()) {
    auto data = at::empty({size.item<std::int64_t>()}, at::kByte);
    links_.receive(data, owner, tag + 1)();
    std::memcpy(received.data(), data.data_ptr(), received.size());
  }
  return received;
}

void pipeline::save_state(const std::filesystem::path& directory, torch::optim::Optimizer& optimizer) {
  links_.with_whole_optimizer_state(optimizer, [&] { write_state(directory, optimizer); });
}

void pipeline::write_state(const std::filesystem::path& directory, const torch::optim::Optimizer& optimizer) {
  auto whole = whole_states(optimizer);  // under dp_shard: every member gathers, before the other replicas return
  save_model(directory);
  if (!writes_checkpoints()) return;
  constexpr int first_tag = 1 << 29;  // above save_model's
  int message = 0;
  torch::serialize::OutputArchive archive;  // written on the pp group's first process
  for (int stage = 0; stage < shape_.stages; ++stage) {
    const int owner = shape_.process_of(stage);
    for (const auto& [name, parameter] : stage_parameters(stage)) {
      std::vector<char> mine;
      if (links_.rank == owner && shards_.empty()) mine = state_bytes(optimizer, parameter);
      if (links_.rank == owner && !shards_.empty()) mine = std::move(whole[parameter.unsafeGetTensorImpl()]);
      auto bytes = gather_bytes(std::move(mine), owner, first_tag + 2 * message++);
      if (links_.rank == 0 && !bytes.empty())
        archive.write(name, at::from_blob(bytes.data(), {static_cast<std::int64_t>(bytes.size())}, at::kByte).clone());
    }
  }
  const auto path = directory / "pipeline_optimizer.pt";
  std::string failure;
  if (links_.rank == 0) try {
      std::ostringstream bytes;  // LibTorch's archive writer aborts on a full disk: accel writes the file
      archive.save_to(bytes);
      detail::write_atomically<checkpoint_error>(path, [&](auto& out) { out.write(bytes.view()); });
    } catch (const std::exception& e) {
      failure = e.what();
    }
  agree_written(failure, "accel::pipeline::save_state: the pp group's first process could not write " + path.string());
}

void pipeline::load_state(const std::filesystem::path& directory, torch::optim::Optimizer& optimizer) {
  const auto path = directory / "pipeline_optimizer.pt";
  if (!std::filesystem::exists(path))
    throw checkpoint_error("accel::pipeline::load_state: " + path.string() +
                           " does not exist: pipe.save_state(directory, optimizer) writes it (save_model writes the "
                           "weights alone, which load_model loads)");
  // Every state read before anything changes: a damaged file leaves the model and the optimizer as they were.
  torch::serialize::InputArchive archive;
  archive.load_from(path.string());
  std::vector<std::pair<at::Tensor, std::unique_ptr<torch::optim::OptimizerParamState>>> states;
  for (const int stage : local_stages_)
    for (const auto& [name, parameter] : stage_parameters(stage)) {
      at::Tensor bytes;
      std::unique_ptr<torch::optim::OptimizerParamState> state;
      if (archive.try_read(name, bytes)) {
        torch::serialize::InputArchive part;
        part.load_from(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
        state = detail::empty_state_of(optimizer);
        if (!state)
          throw std::invalid_argument(
              "accel::pipeline::load_state: the optimizer is none of SGD, Adam, AdamW, Adagrad and RMSprop, whose "
              "per-parameter state a pipeline checkpoint holds; use one of them, or save the weights alone "
              "(save_model)");
        state->serialize(part);
      }
      states.emplace_back(parameter, std::move(state));
    }
  load_model(directory);
  const auto parameters = module_->parameters();
  links_.load_whole_optimizer_state(optimizer, [&] {  // tp: each split layer's state sliced after
    for (auto& [parameter, state] : states) {
      auto updated = parameter;  // what the optimizer updates: under dp_shard, the parameter's shard
      if (!shards_.empty()) {
        const auto index = detail::pp::index_of(parameters, parameter);
        updated = shards_[index];
        if (state) cut_to_shard(*state, index);
      }
      const auto key = detail::compat::optimizer_state_key(updated);
      if (state)
        optimizer.state()[key] = std::move(state);
      else
        optimizer.state().erase(key);  // none saved: the parameter had not been stepped
    }
  });
}

void pipeline::load_model(const std::filesystem::path& where) {
  const auto whole = whole_parameters();  // under dp_shard: the shards cut again from what was loaded
  links_.with_whole_layers(*whole_, [&] { accel::load_model(*whole_, where); });  // tp: sliced again
}

at::Tensor pipeline::step(const at::Tensor& input, const at::Tensor& target, const loss_function& loss) {
  const auto m = shape_.micro_batches;
  if (input.size(0) % m != 0 || target.size(0) != input.size(0))
    throw std::invalid_argument("accel::pipeline::step: a batch of " + std::to_string(input.size(0)) +
                                " samples (targets: " + std::to_string(target.size(0)) + ") does not cut into " +
                                std::to_string(m) +
                                " equal micro-batches; give batches of a multiple of micro_batches (drop_last)");
  unshard();
  step_state state;
  state.inputs = input.split(input.size(0) / m);
  if (input.requires_grad())
    for (auto& piece : state.inputs) piece = piece.detach().requires_grad_(true);
  state.callers_input_gradient.assign(static_cast<std::size_t>(m), at::Tensor());
  state.targets = target.split(target.size(0) / m);
  const auto local = stage_modules_.size();
  for (auto* slots : {&state.stage_input, &state.stage_output, &state.output_gradient, &state.input_gradient})
    slots->assign(local, std::vector<at::Tensor>(static_cast<std::size_t>(m)));
  if (split_weights_) state.linears.assign(local, std::vector<std::vector<detail::pp::linear_pass>>(m));
  state.loss_sum = at::zeros({}, input.options().dtype(at::kFloat));
  state.headers = input.sizes().vec() != known_input_ || target.sizes().vec() != known_target_;
  const auto started = std::chrono::steady_clock::now();
  detail::pp::compute_clock clock;
  post_receives_from(0, state);
  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const bool computes = detail::pp::computes(actions_[i]);
    if (computes) post_receives_from(i + 1, state);
    const auto begun = std::chrono::steady_clock::now();
    run(actions_[i], state, loss);
    if (computes) clock.add(actions_[i].op, std::chrono::steady_clock::now() - begun);
  }
  if (state.headers) {  // every process alike: the peers see the same batch
    known_input_ = input.sizes().vec();
    known_target_ = target.sizes().vec();
  }
  for (auto& [tag, send] : state.sends) detail::pp::finish(send);
  timing_ = clock.timing(std::chrono::steady_clock::now() - started);
  if (input.requires_grad()) backward_into_callers_input(input, state);
  if (!shards_.empty()) {
    reduce_gradients_into_shards();
    reshard();
  } else if (links_.replicas > 1) {
    average_over_replicas();
  }
  if (links_.size > 1) links_.broadcast(state.loss_sum, shape_.process_of(shape_.stages - 1));
  return state.loss_sum;
}

void pipeline::average_over_replicas() {
  // One all-reduce of every gradient, flattened: the replicas of a stage hold the same parameters.
  std::vector<at::Tensor> grads;
  for (const auto& parameter : parameters())
    if (parameter.grad().defined()) grads.push_back(parameter.grad());
  if (grads.empty()) return;
  auto flat = torch::utils::flatten_dense_tensors(grads);
  links_.sum_over_replicas(flat);
  flat.div_(links_.replicas);
  const auto averaged = torch::utils::unflatten_dense_tensors(flat, grads);
  for (std::size_t i = 0; i < grads.size(); ++i) grads[i].copy_(averaged[i]);
}

void pipeline::run(const pipeline_action& action, step_state& state, const loss_function& loss) {
  switch (action.op) {
    case pipeline_op::forward:
      return forward(action.stage, action.micro_batch, state, loss);
    case pipeline_op::backward:
    case pipeline_op::backward_input:
    case pipeline_op::backward_weight:
      return backward(action, state);
    default:
      return transfer(action, state);
  }
}

void pipeline::forward(int stage, int micro_batch, step_state& state, const loss_function& loss) {
  const auto local = static_cast<std::size_t>(stage / shape_.processes);
  const auto mb = static_cast<std::size_t>(micro_batch);
  auto& input = state.stage_input[local][mb];
  if (stage == 0) {
    input = state.inputs[mb];
  } else {
    if (!input.defined())  // the previous stage is this process's
      input = state.stage_output[static_cast<std::size_t>((stage - 1) / shape_.processes)][mb].detach();
    if (input.is_floating_point()) input.requires_grad_(true);
  }
  at::Tensor output;
  {
    const auto scopes = links_.forward_scope ? links_.forward_scope() : nullptr;
    output = split_weights_ ? forward_recording(stage, input, state.linears[local][mb])
                            : stage_module(stage)->forward(input);
  }
  if (stage == shape_.stages - 1) {
    if (links_.float_output && output.is_floating_point()) output = output.to(at::kFloat);
    output = loss(output, state.targets[mb]) / shape_.micro_batches;
    state.loss_sum += output.detach().to(at::kFloat);
  }
  state.stage_output[local][mb] = std::move(output);
}

void pipeline::backward(const pipeline_action& action, step_state& state) {
  const auto local = static_cast<std::size_t>(action.stage / shape_.processes);
  const auto mb = static_cast<std::size_t>(action.micro_batch);
  auto& root = state.stage_output[local][mb];
  auto& input = state.stage_input[local][mb];
  const bool last = action.stage == shape_.stages - 1;
  std::vector<at::Tensor> root_gradient;
  if (!last) root_gradient.push_back(state.output_gradient[local][mb]);
  // The input's gradient goes to the previous stage, or on the first to the caller's input (at the step's end);
  // the split passes compute it only then.
  const bool input_requires_grad = input.defined() && input.requires_grad();
  const auto use = !input_requires_grad ? input_gradient_use::none
                   : action.stage > 0   ? input_gradient_use::previous_stage
                                        : input_gradient_use::callers_input;
  // The next stage has sent this output's gradient: it received the output long ago.
  if (const auto sent = state.sends.find(detail::pp::message_tag(false, action.stage + 1, action.micro_batch, shape_));
      sent != state.sends.end()) {
    detail::pp::finish(sent->second);
    state.sends.erase(sent);
  }
  if (split_weights_ && action.op == pipeline_op::backward_input) {
    input_pass(local, mb, use, root_gradient, state);
  } else if (split_weights_ && action.op == pipeline_op::backward_weight) {
    weight_pass(state.linears[local][mb]);
  } else if (action.op == pipeline_op::backward_input) {
    if (use != input_gradient_use::none)
      deliver_input_gradient(use, torch::autograd::grad({root}, {input}, root_gradient, /*retain_graph=*/true).at(0),
                             local, mb, state);
  } else {
    // backward_weight leaves the input's gradient to backward_input; backward computes both in one pass.
    std::vector<at::Tensor> only;
    if (action.op == pipeline_op::backward_weight) only = stage_module(action.stage)->parameters();
    torch::autograd::backward({root}, root_gradient, /*retain_graph=*/false, /*create_graph=*/false, only);
    if (action.op == pipeline_op::backward && use != input_gradient_use::none)
      deliver_input_gradient(use, input.grad(), local, mb, state);
    root = at::Tensor();
    input = at::Tensor();
    state.output_gradient[local][mb] = at::Tensor();
  }
  const bool input_gradient_ready = action.op != pipeline_op::backward_weight;
  if (input_gradient_ready && action.stage > 0 && shape_.process_of(action.stage - 1) == links_.rank)
    state.output_gradient[static_cast<std::size_t>((action.stage - 1) / shape_.processes)][mb] =
        std::exchange(state.input_gradient[local][mb], at::Tensor());
}

void pipeline::transfer(const pipeline_action& action, step_state& state) {
  if (action.op == pipeline_op::send_activation || action.op == pipeline_op::send_gradient)
    send(action, state);
  else
    receive(action, state);
}

void pipeline::send(const pipeline_action& action, step_state& state) {
  const auto local = static_cast<std::size_t>(action.stage / shape_.processes);
  const auto mb = static_cast<std::size_t>(action.micro_batch);
  const bool gradient = action.op == pipeline_op::send_gradient;
  const int to = gradient ? action.stage - 1 : action.stage + 1;
  auto data =
      (gradient ? std::exchange(state.input_gradient[local][mb], at::Tensor()) : state.stage_output[local][mb].detach())
          .contiguous();
  const int peer = shape_.process_of(to);
  const int tag = detail::pp::message_tag(gradient, to, action.micro_batch, shape_);
  auto& send = state.sends[tag];
  if (state.headers) {
    if (data.dim() > detail::pp::header_length - 2)
      throw std::invalid_argument("accel::pipeline: a stage's output has " + std::to_string(data.dim()) +
                                  " dimensions, more than the 8 a message carries; reshape it between stages");
    send.header = at::zeros({detail::pp::header_length}, at::kLong);
    auto* fields = send.header.data_ptr<std::int64_t>();
    fields[0] = static_cast<std::int64_t>(data.scalar_type());
    fields[1] = data.dim();
    for (std::int64_t d = 0; d < data.dim(); ++d) fields[2 + d] = data.size(d);
    send.header_sent = links_.send(send.header, peer, tag);
  }
  send.data_sent = links_.send(data, peer, tag + 1);
  send.data = std::move(data);
}

void pipeline::post_receives_from(std::size_t first, step_state& state) {
  if (state.headers) return;  // the shapes come with the messages
  for (auto next = first; next < actions_.size() && !detail::pp::computes(actions_[next]); ++next) {
    const auto& action = actions_[next];
    if (action.op != pipeline_op::receive_activation && action.op != pipeline_op::receive_gradient) continue;
    const auto [tag, peer] = detail::pp::incoming_for(action, shape_);
    const auto& known = message_shapes_[static_cast<std::size_t>(tag / 2)];
    auto& posted = state.receives[tag];
    posted.data = at::empty(known.sizes, at::TensorOptions().dtype(known.dtype));
    posted.received = links_.receive(posted.data, peer, tag + 1);
  }
}

void pipeline::receive(const pipeline_action& action, step_state& state) {
  const auto [tag, peer] = detail::pp::incoming_for(action, shape_);
  at::Tensor data;
  if (state.headers) {
    auto header = at::empty({detail::pp::header_length}, at::kLong);
    links_.receive(header, peer, tag)();
    const auto* fields = header.data_ptr<std::int64_t>();
    auto& known = message_shapes_[static_cast<std::size_t>(tag / 2)];
    known.sizes.assign(fields + 2, fields + 2 + fields[1]);
    known.dtype = static_cast<at::ScalarType>(fields[0]);
    data = at::empty(known.sizes, at::TensorOptions().dtype(known.dtype));
    links_.receive(data, peer, tag + 1)();
  } else {
    auto posted = state.receives.extract(tag);
    if (posted.empty()) throw std::logic_error("accel::pipeline: a receive was not posted ahead (a bug)");
    posted.mapped().received();
    data = std::move(posted.mapped().data);
  }
  (action.op == pipeline_op::receive_gradient ? state.output_gradient : state.stage_input)[static_cast<std::size_t>(
      action.stage / shape_.processes)][static_cast<std::size_t>(action.micro_batch)] = std::move(data);
}

}  // namespace accel
