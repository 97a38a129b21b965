/// \file
/// `accel::accelerator<Precision, Parallel, Accumulation>`: composes three policies into a training loop's
/// backward, gradient sync and optimizer step. Each policy decides its own part, so the code generated for a
/// configuration holds no run-time branch on a decision a template argument already made.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <c10/core/Device.h>
#include <torch/types.h>  // before clip_grad.h, which uses torch::Tensor without including it
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "accumulation.hpp"
#include "collectives.hpp"
#include "concepts.hpp"
#include "checkpoint.hpp"
#include "data_loader.hpp"
#include "detail/diagnostics.hpp"
#include "detail/scope.hpp"
#include "options.hpp"
#include "parallel.hpp"
#include "precision.hpp"
#include "prepared_model.hpp"
#include "prepared_optimizer.hpp"
#include "prepared_range.hpp"
#include "prepared_scheduler.hpp"
#include "progress.hpp"
#include "shard.hpp"
#include "tracking.hpp"

namespace accel {
namespace detail {
/// The total `norm_type`-norm of the parameters' gradients, as `clip_grad_norm_` computes it, without clipping.
inline double gradient_norm(const std::vector<at::Tensor>& parameters, double norm_type) {
  std::vector<at::Tensor> norms;
  for (const auto& p : parameters)
    if (p.grad().defined()) norms.push_back(p.grad().norm(norm_type));
  if (norms.empty()) return 0.0;
  return std::isinf(norm_type) ? at::stack(norms).max().item<double>() : at::stack(norms).norm(norm_type).item<double>();
}

/// The run-time switches an accelerator reads from its options.
struct run_flags {
  bool device_placement;
  bool sync_with_dataloader;
  bool sync_each_batch;
  bool split_batches;
  bool even_batches;
  bool drop_last;
  std::optional<std::int64_t> batch_size;
  bool step_scheduler_with_optimizer;
};

template <class T>
inline constexpr bool is_prepared_model = false;
template <class M, class A>
inline constexpr bool is_prepared_model<prepared_model<M, A>> = true;
}  // namespace detail

/// The training-loop driver. Default-constructible; `accelerator(options)` sets the run-time knobs.
///
/// Prepared objects refer to the accelerator that prepared them, so an accelerator is neither copied nor moved:
/// build it first and keep it alive for as long as they are used (as Accelerate's process-wide state is).
template <precision_policy Precision = fp32, parallel_policy Parallel = single_process,
          accumulation_policy Accumulation = no_accumulation>
class accelerator {
 public:
  using precision_type = Precision;
  using parallel_type = Parallel;
  using accumulation_type = Accumulation;

  accelerator() : accelerator(options{}) {}
  explicit accelerator(const options& opts)
      : parallel_(opts),
        precision_(opts, parallel_.device()),
        accumulation_(opts),
        project_(opts.project),
        flags_{.device_placement = opts.device_placement,
               .sync_with_dataloader = opts.sync_with_dataloader,
               .sync_each_batch = opts.sync_each_batch,
               .split_batches = opts.split_batches,
               .even_batches = opts.even_batches,
               .drop_last = opts.drop_last,
               .batch_size = opts.batch_size,
               .step_scheduler_with_optimizer = opts.step_scheduler_with_optimizer},
        trackers_(opts.log_with, opts.project) {}

  accelerator(const accelerator&) = delete;
  accelerator& operator=(const accelerator&) = delete;

  /// Prepares models, optimizers, LR schedulers and ranges of batches for this configuration and returns them
  /// in the same order (a tuple; one argument gives the prepared object itself). Lvalues are referred to,
  /// rvalues are owned. Models are moved to `device()` in place, so optimizers built on their parameters keep
  /// pointing at them.
  template <class... Objects>
  [[nodiscard]] auto prepare(Objects&&... objects) {
    static_assert(sizeof...(Objects) > 0, "accel::accelerator::prepare() needs at least one object to prepare");
    if constexpr (sizeof...(Objects) == 1)
      return prepare_one(std::forward<Objects>(objects)...);
    else
      return std::tuple{prepare_one(std::forward<Objects>(objects))...};  // braces: evaluated left to right
  }

  /// Runs backward on `loss`, divided by the accumulation steps and scaled as the precision policy requires.
  void backward(const at::Tensor& loss) { precision_.backward(accumulation_.scale_loss(loss)); }

  /// The precision policy's forward scope (autocast for bf16/fp16; nothing for fp32), for code outside a
  /// prepared model. Keep the returned object alive for as long as the scope should last.
  [[nodiscard]] auto autocast() const { return precision_.forward_scope(device()); }

  /// Starts a micro-step of gradient accumulation for the scope it returns (Accelerate's `accumulate`): counts
  /// it, decides whether it synchronises (every N-th, and the last batch of a prepared range), and when it does not,
  /// runs the whole scope, forward and backward, without gradient communication for `models` (no_sync). Keep the
  /// returned object alive for the forward and backward: `auto scope = acc.accumulate(model);`. With
  /// `no_accumulation` it is an empty object and generates no code.
  template <class... Models>
  [[nodiscard]] auto accumulate(const Models&... models) {
    if constexpr (detail::always_syncs<Accumulation>) {
      return detail::no_scope{};
    } else {
      accumulation_.begin_micro_step(flags_.sync_with_dataloader && end_of_dataloader_);
      const bool communicate = sync_gradients() || flags_.sync_each_batch;
      std::array<std::pair<const torch::nn::Module*, bool>, sizeof...(Models)> previous{
          std::pair<const torch::nn::Module*, bool>{&module_of(models), parallel_.gradient_sync(module_of(models))}...};
      for (auto& [module, was] : previous) parallel_.set_gradient_sync(*module, was && communicate);
      return detail::scope_exit([this, previous] {
        for (auto& [module, was] : previous) parallel_.set_gradient_sync(*module, was);
      });
    }
  }

  /// Divides the prepared optimizers' gradients by the fp16 loss scale, once per step (a second call, or the
  /// optimizer's own step, does not unscale again); nothing on an accumulation micro-step that does not
  /// synchronise. Nothing to do for fp32 and bf16. Call it before reading or
  /// changing gradients by hand on a step that synchronises.
  void unscale_gradients() {
    if (!sync_gradients()) return;  // partial sums: later micro-steps would add scaled gradients to unscaled ones
    for (auto* optimizer : live_optimizers()) precision_.unscale(*optimizer);
  }
  /// Unscales the gradients (once per step), then clips their total `norm_type`-norm to `max_norm`; returns the
  /// total norm before clipping. On an accumulation micro-step that does not synchronise, the gradients are
  /// incomplete (and, under fp16, still scaled): nothing is clipped, and the result is their current norm, unscaled.
  double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0) {
    if (!sync_gradients()) return detail::gradient_norm(parameters, norm_type) / precision_.loss_scale();
    unscale_gradients();
    return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
  }
  /// Unscales the gradients (once per step), then clamps each element to [-value, value]. Does nothing on an
  /// accumulation micro-step that does not synchronise.
  void clip_grad_value_(const std::vector<at::Tensor>& parameters, double value) {
    if (!sync_gradients()) return;
    unscale_gradients();
    torch::nn::utils::clip_grad_value_(parameters, value);
  }

  /// True on micro-steps where gradients are synchronised and the optimizer steps.
  [[nodiscard]] bool sync_gradients() const noexcept { return accumulation_.sync_gradients(); }
  /// The micro-step count of gradient accumulation (Accelerate's `accelerator.step`): 1, 2, ... within a pass,
  /// 0 after the last batch of a prepared range. Always 0 with `no_accumulation`.
  [[nodiscard]] int step() const noexcept { return accumulation_.step(); }
  /// Micro-batches per optimizer step.
  [[nodiscard]] int gradient_accumulation_steps() const noexcept { return accumulation_.steps(); }
  /// True while a prepared range yields its last batch (Accelerate's `gradient_state.end_of_dataloader`).
  [[nodiscard]] bool end_of_dataloader() const noexcept { return end_of_dataloader_; }
  /// `options::split_batches` and `options::step_scheduler_with_optimizer`, as the prepared scheduler reads them.
  [[nodiscard]] bool split_batches() const noexcept { return flags_.split_batches; }
  [[nodiscard]] bool step_scheduler_with_optimizer() const noexcept { return flags_.step_scheduler_with_optimizer; }
  /// True when the last optimizer step was skipped (fp16 found non-finite gradients).
  [[nodiscard]] bool optimizer_step_was_skipped() const noexcept { return precision_.step_was_skipped(); }

  [[nodiscard]] const c10::Device& device() const noexcept { return parallel_.device(); }
  [[nodiscard]] int process_index() const noexcept { return parallel_.process_index(); }
  [[nodiscard]] int local_process_index() const noexcept { return parallel_.local_process_index(); }
  [[nodiscard]] int num_processes() const noexcept { return parallel_.num_processes(); }
  [[nodiscard]] bool is_main_process() const noexcept { return process_index() == 0; }
  [[nodiscard]] bool is_local_main_process() const noexcept { return local_process_index() == 0; }
  [[nodiscard]] bool is_last_process() const noexcept { return process_index() == num_processes() - 1; }
  /// The policies themselves, read-only: their state (an fp16 loss scale, a process group) for tools built on
  /// accel.
  [[nodiscard]] const Precision& precision() const noexcept { return precision_; }
  [[nodiscard]] const Parallel& parallel() const noexcept { return parallel_; }
  [[nodiscard]] const Accumulation& accumulation() const noexcept { return accumulation_; }

  /// Whether `prepare()` places models and batches on `device()` (`options::device_placement`).
  [[nodiscard]] bool device_placement() const noexcept { return flags_.device_placement; }

  /// Prints its arguments separated by spaces, then a newline, on the local main process only (as Python's
  /// `print` does in Accelerate's `accelerator.print`). The line is written in one piece.
  template <class... Args>
  void print(const Args&... args) const {
    if (!is_local_main_process()) return;
    std::ostringstream line;
    const char* separator = "";
    ((line << separator << args, separator = " "), ...);
    line << '\n';
    std::cout << line.str() << std::flush;
  }

  /// Blocks until every process reaches this point.
  void wait_for_everyone() { parallel_.wait_for_everyone(); }

  /// `range` with a progress bar (accel/progress.hpp) on the local main process, e.g.
  /// `for (auto&& [x, y] : acc.progress(batches, {.description = "epoch 1"}))`: redrawn in place on a terminal,
  /// a plain line now and then otherwise. Other processes iterate the same range without a bar.
  template <std::ranges::input_range Range>
  [[nodiscard]] auto progress(Range&& range, progress_options options = {}) const {
    options.enabled = options.enabled && is_local_main_process();
    return accel::progress(std::forward<Range>(range), std::move(options));
  }

  // Experiment tracking (accel/tracking.hpp). Trackers live on the main process; elsewhere these do nothing.

  /// Starts the trackers of `options::log_with` in `{logging_dir or project_dir}/{project_name}/` (created, with
  /// the configuration as `config.json`), plus the user's own `extra` ones, and gives each the configuration. On
  /// the main process only; call it on every process.
  void init_trackers(const std::string& project_name, const hyperparameters& config = {},
                     std::vector<std::shared_ptr<general_tracker>> extra = {}) {
    trackers_.start(project_name, config, std::move(extra), is_main_process());
  }
  /// Logs `metrics` to every tracker at `step` (default: the number of earlier `log` calls). Tensor metrics are
  /// read on the main process only.
  void log(const std::vector<metric>& metrics, std::optional<std::int64_t> step = std::nullopt) {
    trackers_.log(metrics, step, is_main_process());
  }
  /// Finishes (flushes and closes) every tracker, then waits for every process (Accelerate's `end_training`).
  void end_training() {
    trackers_.finish();
    wait_for_everyone();
  }
  /// The active tracker of that kind or name; throws when none is. Other processes get a tracker that ignores
  /// everything.
  [[nodiscard]] general_tracker& get_tracker(tracker kind) { return get_tracker(tracker_name(kind)); }
  [[nodiscard]] general_tracker& get_tracker(std::string_view name) { return trackers_.get(name, is_main_process()); }

  // Collectives (accel/collectives.hpp). Tensors may be nested in vectors, tuples, pairs and string maps.

  /// Every process's tensor, concatenated along dim 0 in process order (0-d tensors become one element each).
  template <class Tensors>
  [[nodiscard]] Tensors gather(const Tensors& tensors) {
    auto&& comm = parallel_.communicator();
    return detail::gather(comm, tensors);
  }
  /// Every process's value, in process order; a `std::vector` is flattened one level, as Accelerate's.
  template <class T>
  [[nodiscard]] auto gather_object(const T& value) {
    auto&& comm = parallel_.communicator();
    return detail::gather_object(comm, value);
  }
  /// The element-wise sum (the default, as Accelerate's), mean or max over the processes; a new tensor.
  template <class Tensors>
  [[nodiscard]] Tensors reduce(const Tensors& tensors, reduction op = reduction::sum) {
    auto&& comm = parallel_.communicator();
    return detail::reduce(comm, tensors, op);
  }
  /// Pads `dim` of every tensor to the largest size among the processes with `pad_index` (at the end, or at the
  /// start with `pad_first`), so that they can be gathered.
  template <class Tensors>
  [[nodiscard]] Tensors pad_across_processes(const Tensors& tensors, std::int64_t dim = 0, double pad_index = 0,
                                             bool pad_first = false) {
    auto&& comm = parallel_.communicator();
    return detail::pad_across_processes(comm, tensors, dim, pad_index, pad_first);
  }
  /// Overwrites the tensors with those of `from_process` (in place) and returns them.
  template <class Tensors>
  Tensors broadcast(const Tensors& tensors, int from_process = 0) {
    auto&& comm = parallel_.communicator();
    return detail::broadcast(comm, tensors, from_process);
  }

  /// `gather`, then, on the last batch of a prepared range, drops the samples that even_batches duplicated to
  /// complete the last round (Accelerate's `gather_for_metrics`): metrics see every sample exactly once. Tensors
  /// (nested or not) are gathered; other values (a `std::vector` of results, say) go through `gather_object`.
  template <class Data>
  [[nodiscard]] Data gather_for_metrics(const Data& data) {
    const auto keep = end_of_dataloader_ ? remainder_ : -1;
    if constexpr (detail::is_tensor_structure<Data>) {
      auto gathered = gather(data);
      if (keep <= 0) return gathered;
      auto truncate = [keep](const at::Tensor& t) { return t.narrow(0, 0, std::min(keep, t.size(0))); };
      return detail::map_tensors(gathered, truncate);
    } else {
      static_assert(detail::is_vector<Data>, "accel::gather_for_metrics takes tensors, or a std::vector of values");
      auto gathered = gather_object(data);
      if (keep > 0 && static_cast<std::int64_t>(gathered.size()) > keep) gathered.resize(static_cast<std::size_t>(keep));
      return gathered;
    }
  }

  /// This process's part of `data` (a `std::vector`, a tensor along dim 0, or a `std::map`): contiguous parts,
  /// the first `size % num_processes()` processes one element more (Accelerate's `split_between_processes`).
  /// With `apply_padding`, every part has the largest size, completed by repeating the last element, so that the
  /// parts can be gathered.
  template <class Data>
  [[nodiscard]] Data split_between_processes(const Data& data, bool apply_padding = false) const {
    return detail::split_between_processes(data, process_index(), num_processes(), apply_padding);
  }

  /// Makes the next pass of `range` start after its first `n` batches of this process, without reading them:
  /// resuming mid-epoch (Accelerate's `skip_first_batches`). Later passes are whole. Returns `range`.
  template <class Range>
  Range& skip_first_batches(Range& range, std::size_t n) const {
    static_assert(detail::is_prepared<Range> && requires(Range& r, std::size_t k) { r.skip_first_batches(k); },
                  "accel::skip_first_batches takes a range that prepare() returned");
    range.skip_first_batches(n);
    return range;
  }

  /// Releases what `prepare` registered (Accelerate's `free_memory`): the accelerator's references to the prepared
  /// models (their memory goes when yours does), optimizers, schedulers and data ranges, the models' gradient
  /// synchronisation, and the micro-step count. The accelerator can then prepare new objects, and `save_state`
  /// saves only those; what `register_for_checkpointing` registered stays. Objects prepared before must not be used
  /// afterwards. LibTorch's CUDA cache is left as it is.
  void free_memory() {
    models_.clear();
    optimizers_.clear();
    std::erase_if(slots_, [this](const auto& weak) {
      const auto slot = weak.lock();
      return !slot || std::find(owned_slots_.begin(), owned_slots_.end(), slot) == owned_slots_.end();
    });
    if constexpr (requires { parallel_.release_models(); }) parallel_.release_models();
    if constexpr (requires { accumulation_.counter(); }) accumulation_.counter() = detail::micro_step_counter{};
    end_of_dataloader_ = false;
    remainder_ = -1;
  }

  /// Registers `object` for `save_state` / `load_state` (Accelerate's `register_for_checkpointing`): it needs
  /// `save(torch::serialize::OutputArchive&) const` and `load(torch::serialize::InputArchive&)`, or is a LibTorch
  /// LR scheduler. It must outlive the accelerator's checkpoints.
  template <class T>
  void register_for_checkpointing(T& object) {
    auto slot = std::make_shared<detail::checkpoint_slot>();
    slot->what = "custom_checkpoint";
    detail::fill_slot(*slot, object);
    if (!slot->save)
      throw std::invalid_argument("accel::register_for_checkpointing: this object has no save(OutputArchive&) const "
                                  "and load(InputArchive&) members; give it those to have it checkpointed");
    owned_slots_.push_back(slot);
    register_state(slot);
  }

  /// Saves the training state to `directory`, atomically (written beside it, then renamed into place; an earlier
  /// checkpoint there is replaced only once the new one is complete): every prepared model's weights
  /// (`model.safetensors`, `model_1.safetensors`, ...), optimizer (`optimizer.bin`, ...), scheduler
  /// (`scheduler.bin`, ...) and registered object (`custom_checkpoint.bin`, ...) from the main process, and from
  /// every process its RNG state, fp16 loss scale and data positions (`random_states_{rank}.bin`). A collective.
  void save_state(const std::filesystem::path& directory) {
    for (const auto& [what, list] : live_slots())  // on every process, so that none is left at a barrier
      for (std::size_t i = 0; i < list.size(); ++i)
        if (!list[i]->save)
          throw checkpoint_error("accel::save_state: " + what + " " + std::to_string(i) +
                                 " cannot be checkpointed: give it save(OutputArchive&) const and load(InputArchive&)");
    const auto target = detail::checkpoint_directory(directory);
    const auto partial = std::filesystem::path(target.string() + ".partial");
    // A save that failed anywhere leaves the previous checkpoint as it was and nothing beside it.
    const auto remove_partial_on_failure = detail::scope_fail([&] {
      std::error_code ignored;
      if (is_main_process()) std::filesystem::remove_all(partial, ignored);
    });
    on_every_process_or_none("preparing " + partial.string(), [&] {
      if (!is_main_process()) return;
      std::filesystem::remove_all(partial);
      std::filesystem::create_directories(partial);
    });
    on_every_process_or_none("writing its part of the checkpoint", [&] {
      if (is_main_process()) save_shared_state(partial);
      save_process_state(partial);
    });
    on_every_process_or_none("putting " + target.string() + " in place", [&] {
      if (is_main_process()) detail::replace_directory(partial, target);
    });
  }

  /// `save_state` into the project's next automatic checkpoint (`options::project`):
  /// `{project_dir}/checkpoints/checkpoint_{i}`, removing the oldest beyond `total_limit` first. Returns the
  /// directory written.
  std::filesystem::path save_state() {
    if (!project_.automatic_checkpoint_naming)
      throw std::invalid_argument("accel::save_state(): without a directory it needs "
                                  "options::project.automatic_checkpoint_naming; or pass the directory to save to");
    const auto root = std::filesystem::path(project_.project_dir) / "checkpoints";
    auto existing = detail::numbered_checkpoints(root);
    if (!existing.empty() && existing.rbegin()->first == std::numeric_limits<std::int64_t>::max())
      throw checkpoint_error("accel::save_state(): " + existing.rbegin()->second.string() +
                             " has the largest number a checkpoint can have; move the checkpoints away to go on");
    const auto next = existing.empty() ? 0 : existing.rbegin()->first + 1;
    wait_for_everyone();  // every process has its number before the main one prunes
    if (is_main_process() && project_.total_limit > 0)
      while (!existing.empty() && static_cast<int>(existing.size()) + 1 > project_.total_limit) {
        std::filesystem::remove_all(existing.begin()->second);
        existing.erase(existing.begin());
      }
    const auto directory = root / ("checkpoint_" + std::to_string(next));
    save_state(directory);
    return directory;
  }
  /// `load_state` from the project's newest automatic checkpoint.
  void load_state() {
    const auto root = std::filesystem::path(project_.project_dir) / "checkpoints";
    const auto existing = detail::numbered_checkpoints(root);
    if (existing.empty()) throw checkpoint_error("accel::load_state(): no checkpoint_{i} under " + root.string());
    load_state(existing.rbegin()->second);
  }

  /// Restores what `save_state` wrote into the prepared objects. Everything is read and checked first (the files,
  /// the number of processes and of each kind of object, every weight's name, shape and dtype); a problem throws
  /// `accel::checkpoint_error` before anything changes.
  void load_state(const std::filesystem::path& directory) {
    if (!std::filesystem::is_directory(directory))
      throw checkpoint_error("accel::load_state: no checkpoint at " + directory.string());
    auto shared = read_archive(directory / "accel_state.bin");
    const auto expect = [&](const char* key, std::int64_t mine) {
      c10::IValue value;
      if (!shared.try_read(key, value) || !value.isInt())
        throw checkpoint_error("accel::load_state: " + (directory / "accel_state.bin").string() + " lacks \"" + key + "\"");
      if (value.toInt() != mine)
        throw checkpoint_error("accel::load_state: the checkpoint in " + directory.string() + " has " +
                               std::to_string(value.toInt()) + " " + key + ", this program " + std::to_string(mine) +
                               (std::string(key) == "processes" ? "; resume with the same number of processes"
                                                                : "; prepare the same objects, in the same order, as when saving"));
    };
    expect("processes", num_processes());
    expect("models", static_cast<std::int64_t>(models_.size()));
    const auto optimizers = live_optimizers();
    expect("optimizers", static_cast<std::int64_t>(optimizers.size()));
    const auto slots = live_slots();
    for (const auto& [what, list] : slots) expect(what.c_str(), static_cast<std::int64_t>(list.size()));
    for (const auto& key : shared.keys())
      if (key != "processes" && key != "models" && key != "optimizers" && !slots.contains(key))
        expect(key.c_str(), 0);  // the checkpoint holds objects of a kind this program did not prepare
    // Read and check everything before changing anything.
    std::vector<std::map<std::string, at::Tensor>> weights;
    for (std::size_t i = 0; i < models_.size(); ++i) {
      const auto file = directory / numbered("model", i, ".safetensors");
      auto loaded = safetensors::load(file);
      weights.emplace_back(loaded.begin(), loaded.end());
      detail::check_weights_fit(*models_[i], weights.back(),
                                "accel::load_state: the weights in " + file.string() + " do not fit the prepared model");
    }
    std::vector<torch::serialize::InputArchive> optimizer_archives;
    for (std::size_t i = 0; i < optimizers.size(); ++i)
      optimizer_archives.push_back(read_archive(directory / numbered("optimizer", i, ".bin")));
    std::map<std::string, std::vector<torch::serialize::InputArchive>> slot_archives;
    for (const auto& [what, list] : slots)
      if (what != "range")
        for (std::size_t i = 0; i < list.size(); ++i)
          slot_archives[what].push_back(read_archive(directory / numbered(what, i, ".bin")));
    auto mine = read_archive(directory / ("random_states_" + std::to_string(process_index()) + ".bin"));
    const auto lacks = [&](const std::string& what) {
      return checkpoint_error("accel::load_state: random_states_" + std::to_string(process_index()) + ".bin lacks " +
                              what + " (saved by another configuration?)");
    };
    at::Tensor rng;
    if (!mine.try_read("cpu_rng", rng)) throw lacks("the CPU generator state");
    std::vector<torch::serialize::InputArchive> positions;
    if (auto ranges = slots.find("range"); ranges != slots.end())
      for (std::size_t i = 0; i < ranges->second.size(); ++i) {
        positions.emplace_back();
        if (!mine.try_read("range_" + std::to_string(i), positions.back())) throw lacks("range " + std::to_string(i) + "'s position");
      }
    [[maybe_unused]] c10::IValue scale, tracker;
    if constexpr (requires { precision_.scaler(); })
      if (!mine.try_read("loss_scale", scale) || !mine.try_read("growth_tracker", tracker)) throw lacks("the fp16 loss scale");
    // Apply.
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < models_.size(); ++i) detail::copy_weights(*models_[i], weights[i]);
    for (std::size_t i = 0; i < optimizers.size(); ++i) {
      optimizers[i]->load(optimizer_archives[i]);
      c10::IValue lrs;
      if (optimizer_archives[i].try_read("accel_learning_rates", lrs)) {
        const auto values = lrs.toDoubleVector();
        auto& groups = optimizers[i]->param_groups();
        for (std::size_t g = 0; g < groups.size() && g < values.size(); ++g) groups[g].options().set_lr(values[g]);
      }
    }
    for (auto& [what, list] : slots) {
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (what == "range") {
          list[i]->load(positions[i]);
        } else {
          list[i]->load(slot_archives[what][i]);
        }
      }
    }
    {
      auto generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rng);
    }
    for (int device = 0; device < cuda_devices(); ++device) {
      at::Tensor state;
      if (!mine.try_read("cuda_rng_" + std::to_string(device), state)) continue;
      auto generator = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)));
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state);
    }
    if constexpr (requires { accumulation_.counter(); }) {
      c10::IValue step, sync;
      if (mine.try_read("step", step) && mine.try_read("sync_gradients", sync))
        accumulation_.counter().restore(step.toInt(), sync.toBool());
    }
    if constexpr (requires { precision_.scaler(); }) {
      precision_.scaler().load_state({static_cast<float>(scale.toDouble()), static_cast<int>(tracker.toInt())});
    }
  }

  /// Within the returned scope, backward through `model` accumulates gradients locally without communicating
  /// (Accelerate's `no_sync`); the first backward after it all-reduces everything accumulated.
  template <class Model>
  [[nodiscard]] auto no_sync(const Model& model) {
    return gradient_sync_scope(model, false, /*this_backward=*/false);
  }
  /// Within the returned scope, backward through `model` all-reduces even inside `no_sync` or on an
  /// accumulation micro-step (Accelerate's `trigger_sync_in_backward`).
  template <class Model>
  [[nodiscard]] auto trigger_sync_in_backward(const Model& model) {
    return gradient_sync_scope(model, true, /*this_backward=*/true);
  }

  /// The main process runs the scope first, the others once it is done (downloading or preprocessing once).
  [[nodiscard]] auto main_process_first() { return first_then_others(is_main_process()); }
  /// The same per machine: each machine's local main process first.
  [[nodiscard]] auto local_main_process_first() { return first_then_others(is_local_main_process()); }

  /// Raises this process's flag for the next `check_trigger()` (to stop every process early, say).
  void set_trigger() noexcept { trigger_ = true; }
  /// True on every process when any process called `set_trigger()` since the last check; then lowers the flags.
  /// A collective: every process must call it.
  [[nodiscard]] bool check_trigger() {
    if (!on_any_process(trigger_)) return false;
    trigger_ = false;
    return true;
  }

  /// Runs `action` only on the named process and returns its result there (an empty optional elsewhere; nothing
  /// for a void action). Accelerate's `on_main_process` family of decorators.
  template <class Action>
  auto on_main_process(Action&& action) {
    return run_if(is_main_process(), std::forward<Action>(action));
  }
  template <class Action>
  auto on_local_main_process(Action&& action) {
    return run_if(is_local_main_process(), std::forward<Action>(action));
  }
  template <class Action>
  auto on_last_process(Action&& action) {
    return run_if(is_last_process(), std::forward<Action>(action));
  }
  template <class Action>
  auto on_process(int process_index, Action&& action) {
    return run_if(this->process_index() == process_index, std::forward<Action>(action));
  }
  template <class Action>
  auto on_local_process(int local_process_index, Action&& action) {
    return run_if(this->local_process_index() == local_process_index, std::forward<Action>(action));
  }

  /// The model as the user built it: the handle (ModuleHolder or shared_ptr) of a prepared model; any other
  /// model handle is returned as it is. A handle shares the module, so this never copies parameters.
  template <class Model>
  [[nodiscard]] auto unwrap_model(const Model& model) const noexcept {
    if constexpr (detail::is_prepared_model<Model>)
      return model.unwrap();
    else
      return model;
  }

 private:
  template <class Optimizer, class Accelerator>
    requires optimizer_like<Optimizer>
  friend class prepared_optimizer;
  template <model_like Model, class Accelerator>
  friend class prepared_model;
  template <class Range, class Accelerator>
    requires batch_range<Range>
  friend class prepared_range;
  template <class Scheduler, class Accelerator>
    requires scheduler_like<Scheduler>
  friend class prepared_scheduler;

  /// Called by `prepared_range` before it yields each batch: true for the last one of a pass, with the number of
  /// real samples in the last global batch (-1: nothing padded).
  void set_end_of_dataloader(bool last, std::int64_t remainder) noexcept {
    end_of_dataloader_ = last;
    remainder_ = remainder;
  }

  /// Called by `prepared_model` before each forward (data parallel: arm the gradient hooks, sync buffers).
  void before_forward(const torch::nn::Module& module) { parallel_.before_forward(module); }
  /// Called by `prepared_model` on the forward's result (bf16/fp16: float32 outputs).
  template <class Output>
  decltype(auto) forward_output(Output&& output) const {
    return precision_.forward_output(std::forward<Output>(output));
  }
  /// Whether `here` is true on any process (one all-reduce; a collective, as every caller is).
  bool on_any_process(bool here) {
    return reduce(at::scalar_tensor(here ? 1 : 0, at::kInt), reduction::max).template item<int>() != 0;
  }

  /// Runs `step` here, then agrees with every process on whether it succeeded everywhere (one all-reduce, which is
  /// also the barrier between save_state's steps): a failure on any process is raised on all of them, there with
  /// its own error, elsewhere naming the step, so that no process is left waiting for one that gave up.
  template <class Step>
  void on_every_process_or_none(const std::string& step_name, Step&& step) {
    std::exception_ptr failure;
    try {
      std::forward<Step>(step)();
    } catch (...) {
      failure = std::current_exception();
    }
    const bool failed_somewhere = on_any_process(failure != nullptr);
    if (failure) std::rethrow_exception(failure);
    if (failed_somewhere)
      throw checkpoint_error("accel::save_state: another process failed while " + step_name +
                             " (its own error says why); the previous checkpoint, if any, is left in place");
  }

  /// Called by prepared schedulers and ranges (and register_for_checkpointing): what save_state saves.
  void register_state(const std::shared_ptr<detail::checkpoint_slot>& slot) {
    std::erase_if(slots_, [](const auto& s) { return s.expired(); });
    slots_.push_back(slot);
  }
  /// The live slots by kind, in registration order.
  std::map<std::string, std::vector<std::shared_ptr<detail::checkpoint_slot>>> live_slots() const {
    std::map<std::string, std::vector<std::shared_ptr<detail::checkpoint_slot>>> by_kind;
    for (const auto& weak : slots_)
      if (auto slot = weak.lock()) by_kind[slot->what].push_back(slot);
    return by_kind;
  }
  std::vector<torch::optim::Optimizer*> live_optimizers() const {
    std::vector<torch::optim::Optimizer*> out;
    for (const auto& registration : optimizers_)
      if (auto optimizer = registration.lock()) out.push_back(*optimizer);
    return out;
  }
  /// CUDA devices whose generators a checkpoint holds (none without CUDA).
  static int cuda_devices() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }
  /// `model.safetensors`, `model_1.safetensors`, ... as Accelerate names them.
  static std::string numbered(const std::string& stem, std::size_t i, const std::string& extension) {
    std::string name = stem;  // appended in place: GCC 12 warns falsely (-Wstringop-overflow) on stem + (...)
    if (i > 0) name.append("_").append(std::to_string(i));
    return name.append(extension);
  }
  static torch::serialize::InputArchive read_archive(const std::filesystem::path& file) {
    if (!std::filesystem::exists(file))
      throw checkpoint_error("accel::load_state: the checkpoint lacks " + file.string() +
                             " (saved by another configuration, or an incomplete copy)");
    torch::serialize::InputArchive archive;
    try {
      archive.load_from(file.string());
    } catch (const std::exception& e) {
      throw checkpoint_error("accel::load_state: " + file.string() + " is truncated or corrupt: " +
                             detail::first_line(e.what()));
    }
    return archive;
  }
  void save_shared_state(const std::filesystem::path& dir) {
    torch::serialize::OutputArchive shared;
    shared.write("processes", c10::IValue(static_cast<std::int64_t>(num_processes())));
    shared.write("models", c10::IValue(static_cast<std::int64_t>(models_.size())));
    const auto optimizers = live_optimizers();
    shared.write("optimizers", c10::IValue(static_cast<std::int64_t>(optimizers.size())));
    for (const auto& [what, list] : live_slots()) {
      shared.write(what, c10::IValue(static_cast<std::int64_t>(list.size())));
      if (what == "range") continue;  // per process, with the RNG
      for (std::size_t i = 0; i < list.size(); ++i) {
        torch::serialize::OutputArchive archive;
        list[i]->save(archive);
        archive.save_to((dir / numbered(what, i, ".bin")).string());
      }
    }
    shared.save_to((dir / "accel_state.bin").string());
    for (std::size_t i = 0; i < models_.size(); ++i)
      safetensors::save(dir / numbered("model", i, ".safetensors"), detail::state_of(*models_[i]));
    for (std::size_t i = 0; i < optimizers.size(); ++i) {
      torch::serialize::OutputArchive archive;
      optimizers[i]->save(archive);
      // LibTorch's optimizer archive does not restore its groups' options; the learning rate (a scheduler's
      // work) goes alongside.
      std::vector<double> lrs;
      for (auto& group : optimizers[i]->param_groups()) lrs.push_back(group.options().get_lr());
      archive.write("accel_learning_rates", c10::IValue(lrs));
      archive.save_to((dir / numbered("optimizer", i, ".bin")).string());
    }
  }
  void save_process_state(const std::filesystem::path& dir) {
    torch::serialize::OutputArchive mine;
    {
      auto generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      mine.write("cpu_rng", generator.get_state());
    }
    for (int device = 0; device < cuda_devices(); ++device) {
      auto generator = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)));
      std::lock_guard<std::mutex> lock(generator.mutex());
      mine.write("cuda_rng_" + std::to_string(device), generator.get_state());
    }
    if constexpr (requires { accumulation_.counter(); }) {
      mine.write("step", c10::IValue(static_cast<std::int64_t>(accumulation_.counter().step())));
      mine.write("sync_gradients", c10::IValue(accumulation_.counter().sync_gradients()));
    }
    if constexpr (requires { precision_.scaler(); }) {
      const auto state = precision_.scaler().state();
      mine.write("loss_scale", c10::IValue(static_cast<double>(state.scale)));
      mine.write("growth_tracker", c10::IValue(static_cast<std::int64_t>(state.growth_tracker)));
    }
    const auto slots = live_slots();
    if (auto ranges = slots.find("range"); ranges != slots.end())
      for (std::size_t i = 0; i < ranges->second.size(); ++i) {
        torch::serialize::OutputArchive position;
        ranges->second[i]->save(position);
        mine.write("range_" + std::to_string(i), position);
      }
    mine.save_to((dir / ("random_states_" + std::to_string(process_index()) + ".bin")).string());
  }

  /// Called by `prepared_optimizer` on construction: the accelerator finds its optimizers through these.
  void register_optimizer(const std::shared_ptr<torch::optim::Optimizer*>& registration) {
    std::erase_if(optimizers_, [](const auto& r) { return r.expired(); });
    optimizers_.push_back(registration);
  }

  /// Called by `prepared_optimizer::step()`: steps only when gradients are synchronised; the precision policy
  /// decides how (and whether) to step.
  void step_optimizer(torch::optim::Optimizer& optimizer) {
    if (sync_gradients()) precision_.step(optimizer);
  }

  template <class Model>
  static const torch::nn::Module& module_of(const Model& model) {
    if constexpr (detail::is_prepared_model<Model>)
      return *model;
    else
      return *detail::module_pointer(model);
  }

  template <class Model>
  auto gradient_sync_scope(const Model& model, bool enabled, bool this_backward) {
    const auto& module = module_of(model);
    const bool previous = parallel_.gradient_sync(module);
    parallel_.set_gradient_sync(module, enabled, this_backward);
    return detail::scope_exit(
        [this, &module, previous, this_backward] { parallel_.set_gradient_sync(module, previous, this_backward); });
  }

  auto first_then_others(bool first) {
    if (!first) wait_for_everyone();
    return detail::scope_success([this, first] {
      if (first) wait_for_everyone();
    });
  }

  template <class Action>
  static auto run_if(bool here, Action&& action) {
    using result = std::invoke_result_t<Action>;
    if constexpr (std::is_void_v<result>) {
      if (here) std::forward<Action>(action)();
    } else {
      using value = std::remove_cvref_t<result>;
      return here ? std::optional<value>(std::forward<Action>(action)()) : std::nullopt;
    }
  }

  template <class Object>
  auto prepare_one(Object&& object) {
    using type = std::remove_cvref_t<Object>;
    static_assert(!detail::is_prepared<type>,
                  "accel::accelerator::prepare(): this object is already prepared; use the prepared object as it is");
    if constexpr (model_like<type>) {
      return prepare_model(type(std::forward<Object>(object)));
    } else if constexpr (optimizer_like<Object>) {
      return prepared_optimizer<Object, accelerator>(std::forward<Object>(object), *this);
    } else if constexpr (scheduler_like<Object>) {
      return prepared_scheduler<Object, accelerator>(std::forward<Object>(object), *this);
    } else if constexpr (batch_range<Object>) {
      return prepare_range(std::forward<Object>(object));
    } else if constexpr (requires(type& pointer) { requires batch_range<decltype(*pointer)>; }) {
      static_assert(detail::always_false<type>,
                    "accel::accelerator::prepare(): this argument points to a range of batches (such as the "
                    "std::unique_ptr that torch::data::make_data_loader returns); pass the range it points to: "
                    "acc.prepare(*loader)");
    } else {
      static_assert(detail::always_false<type>,
                    "accel::accelerator::prepare() takes models (torch::nn::ModuleHolder or "
                    "std::shared_ptr<torch::nn::Module>), optimizers (torch::optim::Optimizer), LR schedulers "
                    "(anything with step()) and ranges of batches (anything with begin()/end()); this argument is "
                    "none of them");
    }
  }

  /// Under several processes, a range is sharded first: a data loader's index batches, before loading; any other
  /// range's batches themselves.
  template <class Range>
  auto prepare_range(Range&& range) {
    using type = std::remove_cvref_t<Range>;
    if constexpr (detail::always_one_process<Parallel>) {
      return prepared_range<Range, accelerator>(std::forward<Range>(range), *this);
    } else if constexpr (detail::is_data_loader<type>) {
      using sharded = sharded_loader<Range>;
      return prepared_range<sharded, accelerator>(sharded(std::forward<Range>(range), shard_options_here()), *this);
    } else {
      using sharded = shard_view<Range>;
      auto options = shard_options_here();
      options.batch_size = flags_.batch_size;
      options.drop_last = flags_.drop_last;
      return prepared_range<sharded, accelerator>(
          sharded(std::forward<Range>(range), options, typename sharded::infer_batch_size_t{}), *this);
    }
  }
  [[nodiscard]] shard_options shard_options_here() const {
    return {.num_processes = num_processes(),
            .process_index = process_index(),
            .split_batches = flags_.split_batches,
            .even_batches = flags_.even_batches};
  }

  template <class Model>
  prepared_model<Model, accelerator> prepare_model(Model model) {
    if (flags_.device_placement) model->to(device());  // in place: the parameters keep their identity
    parallel_.prepare_model(*model);  // first: a model the processes disagree on is refused, and not registered
    models_.push_back(detail::module_shared(model));
    return {std::move(model), *this};
  }

  [[no_unique_address]] Parallel parallel_;
  [[no_unique_address]] Precision precision_;
  [[no_unique_address]] Accumulation accumulation_;
  detail::run_flags flags_;
  bool trigger_ = false;
  bool end_of_dataloader_ = false;
  std::int64_t remainder_ = -1;
  std::vector<std::weak_ptr<torch::optim::Optimizer*>> optimizers_;
  std::vector<std::shared_ptr<torch::nn::Module>> models_;
  std::vector<std::weak_ptr<detail::checkpoint_slot>> slots_;
  std::vector<std::shared_ptr<detail::checkpoint_slot>> owned_slots_;
  project_options project_;
  detail::tracker_set trackers_;  // last: finished first when the accelerator is destroyed
};

}  // namespace accel
