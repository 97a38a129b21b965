/// \file
/// `accel::accelerator<Precision, Parallel, Accumulation>`: composes three policies into a training loop's
/// backward, gradient sync and optimizer step. Each policy decides its own part, so the code generated for a
/// configuration holds no run-time branch on a decision a template argument already made.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Type.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "accumulation.hpp"
#include "collectives.hpp"
#include "concepts.hpp"
#include "data_loader.hpp"
#include "fwd.hpp"
#include "device_mesh.hpp"
#include "detail/prepared/accelerator_access.hpp"
#include "detail/prepared/prepare.hpp"
#include "detail/checkpoint/schedule.hpp"
#include "detail/checkpoint/training_state.hpp"
#include "detail/comm/flight_recorder.hpp"
#include "detail/config.hpp"
#include "detail/support/deferred.hpp"
#include "detail/support/diagnostics.hpp"
#include "detail/prepared/registry.hpp"
#include "detail/support/scope.hpp"
#include "detail/support/straggler_report.hpp"
#include "detail/tracking/deferred_trackers.hpp"
#include "gradient_state.hpp"
#include "memory.hpp"
#include "model_weights.hpp"
#include "options.hpp"
#include "parallel.hpp"
#include "precision.hpp"
#include "prepared_model.hpp"
#include "prepared_optimizer.hpp"
#include "prepared_range.hpp"
#include "prepared_scheduler.hpp"
#include "shard.hpp"

namespace accel {

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

  accelerator() : accelerator(accel::options{}) {}
  explicit accelerator(const accel::options& opts);
  /// Finishes the trackers, if any were started.
  ~accelerator();

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
      return detail::prepare_object(*this, std::forward<Objects>(objects)...);
    else  // braces: evaluated left to right
      return std::tuple{detail::prepare_object(*this, std::forward<Objects>(objects))...};
  }

  /// Prepares one model as `prepare` does, with Accelerate's `prepare_model` arguments: `device_placement` overrides
  /// `options::device_placement`, and `evaluation_mode` prepares a model used only for inference, which the
  /// parallel policy leaves alone (no broadcast of process 0's weights, no gradient synchronisation, no sharding):
  /// `auto scorer = acc.prepare_model(net, {.evaluation_mode = true});`.
  template <class Model>
  [[nodiscard]] auto prepare_model(Model&& model, const model_options& how = {}) {
    using type = std::remove_cvref_t<Model>;
    static_assert(model_like<type>,
                  "accel::accelerator::prepare_model takes a model (torch::nn::ModuleHolder or "
                  "std::shared_ptr<torch::nn::Module>)");
    static_assert(!detail::is_prepared<type>,
                  "accel::accelerator::prepare_model(): this model is already prepared; use it as it is");
    type held(std::forward<Model>(model));
    prepare_module(detail::module_shared(held), how);
    return prepared_model<type, accelerator>(std::move(held), *this);
  }

  /// Runs backward on `loss`, divided by the accumulation steps and scaled as the precision policy requires.
  void backward(const at::Tensor& loss);

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
      accumulation_.begin_micro_step(options_.sync_with_dataloader && gradient_state_.end_of_dataloader);
      const bool communicate = sync_gradients() || options_.sync_each_batch;
      std::array<std::pair<const torch::nn::Module*, bool>, sizeof...(Models)> previous{
          std::pair<const torch::nn::Module*, bool>{&detail::module_of(models),
                                                    parallel_.gradient_sync(detail::module_of(models))}...};
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
  void unscale_gradients();
  /// Unscales the gradients (once per step), then clips their total `norm_type`-norm to `max_norm`; returns the
  /// total norm before clipping. On an accumulation micro-step that does not synchronise, the gradients are
  /// incomplete (and, under fp16, still scaled): nothing is clipped, and the result is their current norm, unscaled.
  double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0);
  /// Unscales the gradients (once per step), then clamps each element to [-value, value]. Does nothing on an
  /// accumulation micro-step that does not synchronise.
  void clip_grad_value_(const std::vector<at::Tensor>& parameters, double value);

  /// True on micro-steps where gradients are synchronised and the optimizer steps.
  [[nodiscard]] bool sync_gradients() const noexcept { return accumulation_.sync_gradients(); }
  /// The micro-step count of gradient accumulation (Accelerate's `accelerator.step`): 1, 2, ... within a pass,
  /// 0 after the last batch of a prepared range. Always 0 with `no_accumulation`.
  [[nodiscard]] int step() const noexcept { return accumulation_.step(); }
  /// Micro-batches per optimizer step.
  [[nodiscard]] int gradient_accumulation_steps() const noexcept { return accumulation_.steps(); }
  /// Sets the micro-batches per optimizer step (Accelerate's `accelerator.gradient_accumulation_steps = N`), with
  /// `accumulate_dynamic`: between windows only (where `sync_gradients()` is true: before the first micro-step, after
  /// a step, at the end of a pass, after `free_memory()`); in the middle of one it throws `std::logic_error` saying
  /// so. The micro-step count (`step()`) starts again from 0. With an N fixed at compile time it does not compile.
  template <class Policy = Accumulation>
  void set_gradient_accumulation_steps(int steps) {
    static_assert(
        detail::steps_settable<Policy>,
        "accel::accelerator::set_gradient_accumulation_steps: this accelerator's accumulation policy fixes N "
        "at compile time (accumulate<N>, no_accumulation); use accel::accumulate_dynamic to set N at run time");
    accumulation_.set_steps(steps);
  }
  /// Where the data stands for gradient synchronisation (Accelerate's `gradient_state`).
  [[nodiscard]] const accel::gradient_state& gradient_state() const noexcept { return gradient_state_; }
  /// True while a prepared range yields its last batch (Accelerate's `gradient_state.end_of_dataloader`).
  [[nodiscard]] bool end_of_dataloader() const noexcept { return gradient_state_.end_of_dataloader; }
  /// The options the accelerator was built with (`split_batches`, `step_scheduler_with_optimizer`, ... as the
  /// prepared objects read them).
  [[nodiscard]] const accel::options& options() const noexcept { return options_; }
  [[nodiscard]] bool split_batches() const noexcept { return options_.split_batches; }
  [[nodiscard]] bool step_scheduler_with_optimizer() const noexcept { return options_.step_scheduler_with_optimizer; }
  /// True when the last optimizer step was skipped (fp16 found non-finite gradients).
  [[nodiscard]] bool optimizer_step_was_skipped() const noexcept { return precision_.step_was_skipped(); }

  [[nodiscard]] const c10::Device& device() const noexcept { return parallel_.device(); }
  [[nodiscard]] int process_index() const noexcept { return parallel_.process_index(); }
  [[nodiscard]] int local_process_index() const noexcept { return parallel_.local_process_index(); }
  [[nodiscard]] int num_processes() const noexcept { return parallel_.num_processes(); }
  [[nodiscard]] bool is_main_process() const noexcept { return process_index() == 0; }
  [[nodiscard]] bool is_local_main_process() const noexcept { return local_process_index() == 0; }
  [[nodiscard]] bool is_last_process() const noexcept { return process_index() == num_processes() - 1; }
  /// Accelerate's `parallelism_config`: the device mesh that `options::parallelism_config` and `accel launch
  /// --parallelism_config_*` (or PARALLELISM_CONFIG_*_SIZE, or the config file's parallelism_config block through
  /// `accel launch`) configure, the program's sizes first (`configured_mesh`), validated for this job when the
  /// accelerator was made (`accel::mesh_error` otherwise); none when nothing configures one.
  [[nodiscard]] const std::optional<mesh_layout>& parallelism_config() const noexcept { return parallelism_; }
  /// This process's index along the mesh's dimensions, 0 along a dimension of size 1, as Accelerate's properties of
  /// the same names: dp_replicate, dp_shard, tp and cp. Throws `accel::mesh_error` when no mesh is configured.
  /// (Accelerate's `context_parallel_rank` still raises NotImplementedError; accel's mesh has cp, so it answers.)
  [[nodiscard]] int data_parallel_rank() const { return mesh_index("dp_replicate", "data_parallel_rank"); }
  [[nodiscard]] int data_parallel_shard_rank() const { return mesh_index("dp_shard", "data_parallel_shard_rank"); }
  [[nodiscard]] int tensor_parallel_rank() const { return mesh_index("tp", "tensor_parallel_rank"); }
  [[nodiscard]] int context_parallel_rank() const { return mesh_index("cp", "context_parallel_rank"); }

  /// The policies themselves, read-only: their state (an fp16 loss scale, a process group) for tools built on
  /// accel.
  [[nodiscard]] const Precision& precision() const noexcept { return precision_; }
  [[nodiscard]] const Parallel& parallel() const noexcept { return parallel_; }
  [[nodiscard]] const Accumulation& accumulation() const noexcept { return accumulation_; }

  /// Whether `prepare()` places models and batches on `device()` (`options::device_placement`).
  [[nodiscard]] bool device_placement() const noexcept { return options_.device_placement; }

  /// Prints its arguments separated by spaces, then a newline, on the local main process only (as Python's
  /// `print` does in Accelerate's `accelerator.print`). The line is written in one piece.
  template <class... Args>
  void print(const Args&... args) const {
    if (!is_local_main_process()) return;
    std::ostringstream line;
    [[maybe_unused]] const char* separator = "";  // unused when there is nothing to print
    ((line << separator << args, separator = " "), ...);
    line << '\n';
    std::cout << line.str() << std::flush;
  }

  /// Blocks until every process reaches this point, having waited for this process's asynchronous save, if one is in
  /// flight (its failure raised).
  void wait_for_everyone();

  /// `range` with a progress bar (accel/progress.hpp) on the local main process, e.g.
  /// `for (auto&& [x, y] : acc.progress(batches, {.description = "epoch 1"}))`: redrawn in place on a terminal,
  /// a plain line now and then otherwise. Other processes iterate the same range without a bar.
  /// Needs `#include <accel/progress.hpp>` (accel.hpp includes it).
  template <class Range, class Options = progress_options>
  [[nodiscard]] auto progress(Range&& range, Options bar = {}) const {
    using bars = detail::deferred_t<detail::progress_bars, Options>;
    static_assert(detail::is_complete<bars>, "accel::accelerator::progress needs #include <accel/progress.hpp>");
    bar.enabled = bar.enabled && is_local_main_process();
    return bars::over(std::forward<Range>(range), std::move(bar));
  }

  /// Runs LibTorch's profiler over the returned scope (Accelerate's `profile` with `ProfileKwargs`;
  /// accel/profiler.hpp): `auto prof = acc.profile({.schedule = accel::profile_schedule{.wait = 1, .active = 2}});`,
  /// then `prof.step()` after each training step. At its end (`prof.finish()`, or the destructor, which prints what
  /// `finish()` would throw), with `output_trace_dir`, every process writes `profile_{process_index}.json` there in
  /// Chrome trace format, then waits for the others.
  /// Needs `#include <accel/profiler.hpp>` (accel.hpp includes it).
  template <class Options = profile_options>
  [[nodiscard]] auto profile(Options options = {}) {
    using made = detail::deferred_t<profiler, Options>;
    static_assert(detail::is_complete<made>, "accel::accelerator::profile needs #include <accel/profiler.hpp>");
    return made(std::move(options), process_index(), [this] { wait_for_everyone(); });
  }

  // Experiment tracking (accel/tracking.hpp, which these need; accel.hpp includes it). Trackers live on the main
  // process; elsewhere these do nothing.

  /// Starts the trackers of `options::log_with` in `{logging_dir or project_dir}/{project_name}/` (created, with
  /// the configuration as `config.json`), plus the user's own `extra` ones, and gives each the configuration. On
  /// the main process only; call it on every process.
  template <class Config = std::vector<hyperparameter>>
  void init_trackers(const std::string& project_name, const Config& config = {},
                     std::vector<std::shared_ptr<general_tracker>> extra = {}) {
    trackers<Config>().start(project_name, config, std::move(extra), is_main_process());
  }
  /// Logs `metrics` to every tracker at `step` (default: the number of earlier `log` calls). Tensor metrics are
  /// read on the main process only.
  template <class Metric = metric>
  void log(const std::vector<Metric>& metrics, std::optional<std::int64_t> step = std::nullopt) {
    trackers<Metric>().log(metrics, step, is_main_process());
  }
  /// Finishes (flushes and closes) every tracker, then waits for every process (Accelerate's `end_training`).
  void end_training();
  /// The active tracker of that kind or name; throws when none is. Other processes get a tracker that ignores
  /// everything.
  template <class Kind = tracker>
    requires std::same_as<Kind, tracker>
  [[nodiscard]] general_tracker& get_tracker(Kind kind) {
    return trackers<Kind>().get(detail::deferred_t<detail::tracker_set, Kind>::name_of(kind), is_main_process());
  }
  template <class Name = std::string_view>
    requires std::convertible_to<Name, std::string_view>
  [[nodiscard]] general_tracker& get_tracker(const Name& name) {
    return trackers<Name>().get(name, is_main_process());
  }

  // Collectives (accel/collectives.hpp). Tensors may be nested in vectors, tuples, pairs and string maps.

  /// Every process's tensor, concatenated along dim 0 in process order (0-d tensors become one element each).
  template <class Tensors>
  [[nodiscard]] Tensors gather(const Tensors& tensors) {
    detail::collective_caller caller("gather");
    auto&& comm = parallel_.communicator();
    return detail::gather(comm, tensors);
  }
  /// Every process's value, in process order; a `std::vector` is flattened one level, as Accelerate's. Values
  /// travel pickled: numbers, bools, strings, tensors, types with `save(torch::serialize::OutputArchive&) const`,
  /// `load(torch::serialize::InputArchive&)` and a default constructor, and vectors, pairs, tuples and string maps
  /// of them (anything else fails to compile).
  template <class T>
  [[nodiscard]] auto gather_object(const T& value) {
    auto&& comm = parallel_.communicator();
    return detail::gather_object(comm, value);
  }
  /// The element-wise sum (the default, as Accelerate's), mean or max over the processes, times `scale`; a new
  /// tensor.
  template <class Tensors>
  [[nodiscard]] Tensors reduce(const Tensors& tensors, reduction op = reduction::sum, double scale = 1.0) {
    detail::collective_caller caller("reduce");
    auto&& comm = parallel_.communicator();
    return detail::reduce(comm, tensors, op, scale);
  }
  /// Accelerate's `save`: writes `tensors` (name -> tensor: `get_state_dict`'s result, a `std::map`, or
  /// `named_parameters()`) to `path` on the main process only, atomically; the other processes do nothing (not a
  /// collective). A pickled dict (Accelerate's default; Python reads it with `torch.load(path, weights_only=False)`:
  /// LibTorch's pickler tags the dict with a TorchScript type), or with `safe_serialization` a safetensors file.
  template <class Named>
  void save(const Named& tensors, const std::filesystem::path& path, bool safe_serialization = false) const {
    if (is_main_process()) detail::save_tensors(detail::named_tensors(tensors), path, safe_serialization);
  }
  /// `objects` on every process becomes `from_process`'s, in place (the lengths may differ), and is returned
  /// (Accelerate's `broadcast_object_list`). Values travel pickled, as `gather_object`'s.
  template <class T>
  std::vector<T>& broadcast_object_list(std::vector<T>& objects, int from_process = 0) {
    auto&& comm = parallel_.communicator();
    detail::broadcast_object_list(comm, objects, from_process);
    return objects;
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
  /// (nested or not) are gathered; other values (a `std::vector` of results, say) go through `gather_object`, and so
  /// does a `std::vector` of tensors with `use_gather_object` (samples whose shapes differ, which `gather` cannot
  /// concatenate): every process's elements in process order, one sample each. On a mesh with tp, cp or pp, the peers
  /// that read the same batch count it once: the data-parallel ranks' results, in their order, each from its first
  /// tp and cp index on the last pipeline stage (the one that holds a pipeline's outputs).
  template <class Data>
  [[nodiscard]] Data gather_for_metrics(const Data& data, bool use_gather_object = false) {
    detail::collective_caller caller("gather_for_metrics");
    auto&& comm = parallel_.communicator();
    const auto keep = gradient_state_.end_of_dataloader ? gradient_state_.remainder : -1;
    if (!parallelism_) return detail::gather_for_metrics(comm, data, keep, use_gather_object);
    return detail::gather_for_metrics(comm, data, keep, use_gather_object,
                                      parallelism_->counts_its_batch(process_index()), parallelism_->batches_shared());
  }

  /// This process's part of `data` (a `std::vector`, a tensor along dim 0, or a `std::map`): contiguous parts,
  /// the first `size % P` processes one element more (Accelerate's `split_between_processes`), P the processes that
  /// read different batches: `num_processes()`, or on a mesh with tp or cp its data-parallel ranks (the peers get the
  /// same part, as they get the same batches). With `apply_padding`, every part has the largest size, completed by
  /// repeating the last element, so that the parts can be gathered.
  template <class Data>
  [[nodiscard]] Data split_between_processes(const Data& data, bool apply_padding = false) const {
    const auto data_ranks = shard_options_here();
    return detail::split_between_processes(data, data_ranks.process_index, data_ranks.num_processes, apply_padding);
  }

  /// Makes the next pass of `range` start after its first `n` batches of this process, without reading them:
  /// resuming mid-epoch (Accelerate's `skip_first_batches`). Later passes are whole. Returns `range`.
  template <class Range>
  Range& skip_first_batches(Range& range, std::size_t n) const {
    static_assert(
        detail::is_prepared<Range> && requires(Range& r, std::size_t k) { r.skip_first_batches(k); },
        "accel::skip_first_batches takes a range that prepare() returned");
    range.skip_first_batches(n);
    return range;
  }

  /// Releases what `prepare` registered (Accelerate's `free_memory`): the accelerator's references to the prepared
  /// models (their memory goes when yours does), optimizers, schedulers and data ranges, the models' gradient
  /// synchronisation, and the micro-step count. The accelerator can then prepare new objects, and `save_state`
  /// saves only those; what `register_for_checkpointing` registered stays. Objects prepared before must not be used
  /// afterwards. Then, as Accelerate's `clear_device_cache`, the device cache is emptied (`accel::clear_device_cache`:
  /// LibTorch's CUDA caching allocator gives the memory it keeps unused back to the device), so that what the released
  /// objects held is free for the next model, or for another process.
  void free_memory();

  /// Registers `objects` for `save_state` / `load_state`, in order (Accelerate's `register_for_checkpointing`): each
  /// needs `save(torch::serialize::OutputArchive&) const` and `load(torch::serialize::InputArchive&)`, or is a
  /// LibTorch LR scheduler, and must outlive the accelerator's checkpoints. When any cannot be checkpointed, none is
  /// registered and the error lists each such object by its index and type (reference I4).
  template <class... T>
  void register_for_checkpointing(T&... objects) {
    static_assert(sizeof...(T) > 0, "accel::register_for_checkpointing takes the objects to checkpoint");
    std::vector<detail::checkpoint_slot> slots{
        detail::slot_for(detail::checkpoint_files::kind::custom_checkpoint, objects)...};
    const std::vector<std::string> types{c10::demangle(typeid(T).name())...};
    std::string invalid;
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (!slots[i].save) invalid += "\n- item at index " + std::to_string(i) + ", `" + types[i] + "`";
    if (!invalid.empty())
      throw std::invalid_argument(
          "accel::register_for_checkpointing: every object needs save(OutputArchive&) const and load(InputArchive&) "
          "members (or is a LibTorch LR scheduler) to be checkpointed; give these those members:" +
          invalid);
    for (auto& slot : slots) registry_.keep_slot(std::move(slot));
  }

  /// Saves the training state to `directory`, atomically (written beside it, then renamed into place; an earlier
  /// checkpoint there is replaced only once the new one is complete): every prepared model's weights
  /// (`model.safetensors`, `model_1.safetensors`, ...), optimizer (`optimizer.bin`, ...), scheduler
  /// (`scheduler.bin`, ...) and registered object (`custom_checkpoint.bin`, ...) from the main process, and from
  /// every process its RNG state, fp16 loss scale and data positions (`random_states_{rank}.bin`). The save_state
  /// pre-hooks run first. A collective. With `{.safe_serialization = false}` the model files are Accelerate's
  /// `pytorch_model.bin`, `pytorch_model_1.bin`, ... (pickled dicts of tensors) instead.
  /// Needs `#include <accel/checkpoint.hpp>`, as `save_iteration` and `load_state` do (accel.hpp includes it).
  void save_state(const std::filesystem::path& directory, save_options how = {});

  /// `save_state` into the project's next automatic checkpoint (`options::project`):
  /// `{project_dir}/checkpoints/checkpoint_{save_iteration()}`, then removes the oldest beyond `total_limit`.
  /// Returns the directory written.
  std::filesystem::path save_state(save_options how = {});
  /// The number of the checkpoint the next `save_state()` writes (Accelerate's `save_iteration`).
  [[nodiscard]] std::int64_t save_iteration() const;
  /// Makes the next `save_state()` write `checkpoint_{next}`, and the saves after it count up from there.
  void set_save_iteration(std::int64_t next);
  /// Registers `hook` to run on every process at the start of each `save_state`, after the hooks registered before it
  /// (Accelerate's `register_save_state_pre_hook`; `save_state_pre_hook` says what it gets). `remove()` on the handle
  /// unregisters it.
  removable_handle register_save_state_pre_hook(save_state_pre_hook hook);
  /// The same for `load_state` (`load_state_pre_hook`).
  removable_handle register_load_state_pre_hook(load_state_pre_hook hook);
  /// `load_state` from the project's newest complete automatic checkpoint.
  void load_state(std::optional<accel::map_location> where = std::nullopt);

  /// Restores what `save_state` wrote into the prepared objects. The load_state pre-hooks run first; then everything
  /// is read and checked (the files, the number of each kind of object, every weight's name, shape and dtype); a
  /// problem throws `accel::checkpoint_error` before anything changes. A checkpoint written by another number of
  /// processes loads too (docs/checkpoint-format.md says what each process gets). `where` the optimizers' state is
  /// read to (Accelerate's `map_location`; by default `on_device` with several processes on devices of their own,
  /// else `cpu`); it ends on its parameters' devices either way.
  void load_state(const std::filesystem::path& directory, std::optional<accel::map_location> where = std::nullopt);
  /// The same with `load_options`: also `allow_unchecked`, for a checkpoint without a manifest (written by accel
  /// 0.1), whose files nothing checks: `acc.load_state(dir, {.allow_unchecked = true})`, then save it again.
  void load_state(const std::filesystem::path& directory, const load_options& how);
  /// The checkpoint this run last loaded (by `load_state` or `checkpoint_automatically`'s resume); empty when none.
  [[nodiscard]] const std::optional<std::filesystem::path>& resumed_from() const noexcept { return resumed_from_; }
  /// Optimizer steps taken (batches on which a prepared optimizer stepped), over the whole run: a checkpoint holds
  /// the count, so a resumed run goes on from it. What `checkpoint_automatically`'s `every_steps` counts.
  [[nodiscard]] std::int64_t completed_steps() const noexcept { return schedule_.steps(); }

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

  /// Training (or evaluating) on inputs that do not divide evenly between the processes (Accelerate's
  /// `join_uneven_inputs`, over PyTorch's `Join` and DDP's join hook). Keep the returned scope alive around the loop:
  ///
  ///     { auto join = acc.join_uneven_inputs({.even_batches = false}, model);
  ///       for (auto&& [x, y] : batches) { ... } }  // a process that ran out of batches waits for the others here
  ///
  /// `join.even_batches` overrides `options::even_batches` for the prepared ranges' passes begun in the scope (a
  /// stream, or batches dispatched from process 0, cannot: a warning says so), restored when it ends. When the
  /// resulting even_batches is false, the join is active: each forward of a joined model with gradients enabled
  /// tells the other processes this one still trains, and a process whose loop has ended shadows their all-reduces
  /// (with zero gradients: a step's gradients are the sum over the processes still training divided by
  /// `num_processes()`, DDP's `divide_by_initial_world_size`) until every process's has. Then every process takes
  /// the joined models' parameters and buffers, the optimizers', schedulers' and registered objects' state and the
  /// policies' state (micro-step count, fp16 scale, steps taken) from the last process to finish, so that all go on
  /// from one state (PyTorch syncs only the model). Inside the scope, every forward of a joined model with gradients
  /// enabled must be followed by its backward, and collectives other than the joined models' backward (gather,
  /// save_state...) would wait for the processes that have stopped. data_parallel only; with one process, nothing.
  template <class... Models>
  [[nodiscard]] auto join_uneven_inputs(join_options join, const Models&... models) {
    static_assert(sizeof...(Models) > 0, "accel::accelerator::join_uneven_inputs takes the prepared models to join");
    if constexpr (detail::always_one_process<Parallel>) {
      return detail::no_scope{};
    } else if constexpr (!Parallel::joins_uneven_inputs) {
      static_assert(detail::always_false<Parallel>,
                    "accel::accelerator::join_uneven_inputs needs a parallel policy that joins uneven inputs "
                    "(joins_uneven_inputs, as data_parallel): a policy that communicates around each optimizer step "
                    "(the sharded ones) cannot be followed by a process that ran out of data; keep even_batches (the "
                    "default) with it");
      return detail::no_scope{};
    } else {
      std::vector<std::pair<std::shared_ptr<detail::even_batches_switch>, bool>> overridden;
      if (num_processes() > 1 && join.even_batches) overridden = override_even_batches(*join.even_batches);
      const bool active = num_processes() > 1 && !join.even_batches.value_or(options_.even_batches);
      if (active) {
        parallel_.begin_join({&detail::module_of(models)...});
        schedule_.hold_saves();
      }
      const auto restore = [overridden] {
        for (const auto& [range, was] : overridden) range->set(was);
      };
      return detail::scope_end(
          [this, restore, active] {
            restore();
            if (active) finish_join();
          },
          [this, restore, active]() noexcept {
            restore();
            if (!active) return;
            parallel_.abandon_join();
            (void)schedule_.release_saves();
          });
    }
  }
  template <class... Models>
  [[nodiscard]] auto join_uneven_inputs(const Models&... models) {
    return join_uneven_inputs(join_options{}, models...);
  }

  /// The main process runs the scope first, the others once it is done (downloading or preprocessing once).
  [[nodiscard]] auto main_process_first() { return detail::first_then_others(parallel_, is_main_process()); }
  /// The same per machine: each machine's local main process first.
  [[nodiscard]] auto local_main_process_first() {
    return detail::first_then_others(parallel_, is_local_main_process());
  }

  /// Raises this process's flag for the next `check_trigger()` (to stop every process early, say).
  void set_trigger() noexcept { trigger_ = true; }
  /// True on every process when any process called `set_trigger()` since the last check; then lowers the flags.
  /// A collective: every process must call it.
  [[nodiscard]] bool check_trigger();

  /// Runs `action` only on the named process and returns its result there (an empty optional elsewhere; nothing
  /// for a void action). Accelerate's `on_main_process` family of decorators.
  template <class Action>
  auto on_main_process(Action&& action) {
    return detail::run_if(is_main_process(), std::forward<Action>(action));
  }
  template <class Action>
  auto on_local_main_process(Action&& action) {
    return detail::run_if(is_local_main_process(), std::forward<Action>(action));
  }
  template <class Action>
  auto on_last_process(Action&& action) {
    return detail::run_if(is_last_process(), std::forward<Action>(action));
  }
  template <class Action>
  auto on_process(int index, Action&& action) {
    return detail::run_if(process_index() == index, std::forward<Action>(action));
  }
  template <class Action>
  auto on_local_process(int index, Action&& action) {
    return detail::run_if(local_process_index() == index, std::forward<Action>(action));
  }

  /// The model's full weights (Accelerate's `get_state_dict`): each parameter, then each buffer, under its dotted
  /// name, copied to a CPU tensor of its own, the same on every process. Under the sharded policies too: zero1 and
  /// zero2 keep every parameter full; under fully_sharded each parameter is gathered in turn (a collective: every
  /// process calls it), so that the peak is one parameter.
  template <class Model>
  [[nodiscard]] safetensors::tensor_list get_state_dict(const Model& model) {
    auto state = detail::state_of(detail::module_of(model));
    const auto parameters = detail::module_of(model).parameters().size();
    for (std::size_t i = 0; i < state.size(); ++i) {
      auto whole = i < parameters ? parallel_.full_parameter(state[i].second) : state[i].second;
      state[i].second = whole.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
    return state;
  }

  /// Loads the weights in `where` into a prepared model (Accelerate's `load_checkpoint_in_model`): a `.safetensors`
  /// file, or a directory holding Hugging Face's `model.safetensors.index.json` and the files it names, or
  /// `model.safetensors`. Each process reads only the byte ranges of what it holds (under fully_sharded, its slice of
  /// each parameter), never a file whole. Every parameter and buffer must be there with its shape and dtype, and
  /// nothing else; otherwise every process throws `accel::checkpoint_error` and the model is as it was. A collective.
  /// Needs `#include <accel/checkpoint.hpp>` (accel.hpp includes it).
  template <class Model>
  void load_model(const Model& model, const std::filesystem::path& where) {
    checkpoint_io::load_model(parallel_, *detail::module_pointer(unwrap_model(model)), where);
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
  template <class Dependent>
  auto& trackers() {
    using set = detail::deferred_t<detail::tracker_set, Dependent>;
    static_assert(detail::is_complete<set>,
                  "accel::accelerator's init_trackers, log and get_tracker need #include <accel/tracking.hpp>");
    return trackers_.template get<set>(options_);
  }

  [[nodiscard]] int mesh_index(std::string_view dimension, std::string_view query) const;

  using state_type = detail::training_state<Parallel, Precision, Accumulation, Parallel, detail::checkpoint_schedule>;
  /// What reads and writes checkpoints: accel/checkpoint.hpp, which a loop that never saves need not include.
  using checkpoint_io = detail::checkpoint_io<state_type>;
  [[nodiscard]] checkpoint_io checkpoints() { return checkpoint_io(state_); }

  friend struct detail::accelerator_access;

  /// Called by `prepared_optimizer::step()`: steps only when gradients are synchronised; the precision policy
  /// decides whether (fp16 may skip), the parallel policy how.
  void step_optimizer(torch::optim::Optimizer& optimizer);
  /// `resume::latest` at the first pass: the newest checkpoint complete on every process loads (its data position
  /// included).
  void resume_from_newest();

  /// join_uneven_inputs' override of even_batches on every prepared range that can take it; each one's value before.
  std::vector<std::pair<std::shared_ptr<detail::even_batches_switch>, bool>> override_even_batches(bool even);
  /// The end of join_uneven_inputs on this process: shadow the others until all are done, then every process takes
  /// the last one's training state; an automatic save that came due on any process during the join is made now,
  /// once, by every process.
  template <class Policy = Parallel>  // a template: only the policies that join uneven inputs have finish_join
  void finish_join() {
    state_.share_from(parallel_.finish_join());
    if (detail::on_any_process(parallel_, schedule_.release_saves())) schedule_.save_now();
  }

  template <class Model>
  auto gradient_sync_scope(const Model& model, bool enabled, bool this_backward) {
    const auto& module = detail::module_of(model);
    const bool previous = parallel_.gradient_sync(module);
    parallel_.set_gradient_sync(module, enabled, this_backward);
    return detail::scope_exit(
        [this, &module, previous, this_backward] { parallel_.set_gradient_sync(module, previous, this_backward); });
  }

  /// Data is sharded by the data parallel rank: the tp, cp and pp peers of a mesh read the same batches (Accelerate's
  /// loader divides the process index by tp x cp, its innermost dimensions; pp is the outermost).
  [[nodiscard]] shard_options shard_options_here() const;

  /// What preparing a model does, whatever its type: placed, given to the policies, registered.
  void prepare_module(const std::shared_ptr<torch::nn::Module>& module, const model_options& how);
  /// `prepared_optimizer::zero_grad()` and `prepared_model`'s forward, through the one door.
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none);
  void before_forward(const torch::nn::Module& module);
  /// The end of a straggler window: every process's work per step gathered, judged on the main process.
  void report_stragglers(double seconds_per_step);

  [[no_unique_address]] Parallel parallel_;
  [[no_unique_address]] Precision precision_;
  [[no_unique_address]] Accumulation accumulation_;
  accel::options options_;
  std::optional<mesh_layout> parallelism_;
  accel::gradient_state gradient_state_;
  detail::checkpoint_schedule schedule_;
  std::optional<std::filesystem::path> resumed_from_;
  bool trigger_ = false;
  detail::prepared_registry registry_;
  /// What checkpoints hold, and who holds it: the participants with state of their own are listed here, once.
  state_type state_;
  detail::deferred_trackers trackers_;  // made by the first tracking call
  detail::straggler_report stragglers_;
};

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
accelerator<Precision, Parallel, Accumulation>::accelerator(const accel::options& opts)
    : parallel_(opts),
      precision_(opts, parallel_.device()),
      accumulation_(opts),
      options_(opts),
      parallelism_(configured_mesh(opts.parallelism_config, parallel_.num_processes())),
      state_(parallel_, registry_, opts.project, precision_, accumulation_, parallel_, schedule_),
      stragglers_(opts.straggler_window) {}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
accelerator<Precision, Parallel, Accumulation>::~accelerator() = default;

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::end_training() {
  trackers_.finish();
  wait_for_everyone();
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::backward(const at::Tensor& loss) {
  detail::collective_caller caller("backward");
  precision_.backward(accumulation_.scale_loss(loss));
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::unscale_gradients() {
  if (!sync_gradients()) return;  // partial sums: later micro-steps would add scaled gradients to unscaled ones
  for (auto* optimizer : registry_.optimizers()) {
    parallel_.attach_gradients(*optimizer);
    precision_.unscale(*optimizer, parallel_);
  }
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
double accelerator<Precision, Parallel, Accumulation>::clip_grad_norm_(const std::vector<at::Tensor>& parameters,
                                                                       double max_norm, double norm_type) {
  if (!sync_gradients()) return parallel_.gradient_norm(parameters, norm_type) / precision_.loss_scale();
  unscale_gradients();
  return parallel_.clip_grad_norm(parameters, max_norm, norm_type);
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::clip_grad_value_(const std::vector<at::Tensor>& parameters,
                                                                      double value) {
  if (!sync_gradients()) return;
  unscale_gradients();
  torch::nn::utils::clip_grad_value_(parameters, value);
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::wait_for_everyone() {
  detail::collective_caller caller("wait_for_everyone");
  (void)state_.finish_background_save();
  parallel_.wait_for_everyone();
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::free_memory() {
  state_.release_prepared();
  accumulation_.restart();
  gradient_state_ = {};
  clear_device_cache();
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::save_state(const std::filesystem::path& directory,
                                                                save_options how) {
  detail::collective_caller caller("save_state");
  checkpoints().save(directory, how);
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
std::filesystem::path accelerator<Precision, Parallel, Accumulation>::save_state(save_options how) {
  detail::collective_caller caller("save_state");
  return checkpoints().save_next(how);
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
std::int64_t accelerator<Precision, Parallel, Accumulation>::save_iteration() const {
  return checkpoint_io::next_number(state_.settings());
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::set_save_iteration(std::int64_t next) {
  detail::checkpoint_settings::check_checkpoint_number(next, "accel::set_save_iteration");
  state_.settings().next_number = next;
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
removable_handle accelerator<Precision, Parallel, Accumulation>::register_save_state_pre_hook(
    save_state_pre_hook hook) {
  return state_.settings().save_hooks.add(std::move(hook), "accel::register_save_state_pre_hook");
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
removable_handle accelerator<Precision, Parallel, Accumulation>::register_load_state_pre_hook(
    load_state_pre_hook hook) {
  return state_.settings().load_hooks.add(std::move(hook), "accel::register_load_state_pre_hook");
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::load_state(std::optional<accel::map_location> where) {
  detail::collective_caller caller("load_state");
  (void)state_.finish_background_save();  // the newest checkpoint may be the one being written
  load_state(checkpoints().newest(), where);
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::load_state(const std::filesystem::path& directory,
                                                                std::optional<accel::map_location> where) {
  load_state(directory, load_options{.map_location = where});
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::load_state(const std::filesystem::path& directory,
                                                                const load_options& how) {
  detail::collective_caller caller("load_state");
  checkpoints().load(directory, how);
  resumed_from_ = directory;
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
bool accelerator<Precision, Parallel, Accumulation>::check_trigger() {
  if (!detail::on_any_process(parallel_, trigger_)) return false;
  trigger_ = false;
  return true;
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
int accelerator<Precision, Parallel, Accumulation>::mesh_index(std::string_view dimension,
                                                               std::string_view query) const {
  if (!parallelism_)
    throw mesh_error("accel::accelerator::" + std::string(query) +
                     "(): no device mesh is configured; start the job with accel launch "
                     "--parallelism_config_dp_shard_size N (or _dp_replicate_size, _tp_size, _cp_size), or set "
                     "PARALLELISM_CONFIG_*_SIZE");
  return parallelism_->index_along(dimension, process_index());
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::step_optimizer(torch::optim::Optimizer& optimizer) {
  if (!sync_gradients()) return;
  detail::collective_caller caller("step");
  parallel_.attach_gradients(optimizer);
  precision_.step(optimizer, parallel_);
  schedule_.optimizer_stepped();
  if (auto mine = stragglers_.stepped()) report_stragglers(*mine);
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::report_stragglers(double seconds_per_step) {
  detail::collective_caller caller("straggler report");
  const auto options = at::TensorOptions().dtype(at::kDouble).device(parallel_.device());
  const auto gathered = gather(at::full({1}, seconds_per_step, options)).cpu().contiguous();
  if (!is_main_process()) return;
  const auto* figures = gathered.template data_ptr<double>();
  const auto verdict = stragglers_.judge({figures, figures + gathered.numel()}, schedule_.steps());
  if (!verdict.warning.empty()) std::cerr << verdict.warning << std::flush;
  trackers_.log_verdict(verdict, schedule_.steps());
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::resume_from_newest() {
  if (auto newest = checkpoints().agreed_newest()) load_state(*newest);
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
std::vector<std::pair<std::shared_ptr<detail::even_batches_switch>, bool>>
accelerator<Precision, Parallel, Accumulation>::override_even_batches(bool even) {
  std::vector<std::pair<std::shared_ptr<detail::even_batches_switch>, bool>> overridden;
  bool unswitchable = false;
  for (auto& range : registry_.ranges()) {
    if (!range->set) {
      unswitchable = true;
      continue;
    }
    overridden.emplace_back(range, range->get());
    range->set(even);
  }
  if (unswitchable && is_main_process())
    std::cerr << "accel::join_uneven_inputs: even_batches is overridden only for ranges whose batches every "
                 "process reads (data loaders, ranges of batches); streams and dispatched batches keep theirs\n";
  return overridden;
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
shard_options accelerator<Precision, Parallel, Accumulation>::shard_options_here() const {
  // The data-parallel ranks read different batches; their tp, cp and pp peers read the same ones.
  const auto& mesh = parallelism_;
  return {.num_processes = mesh ? mesh->sizes().dp_replicate * mesh->sizes().dp_shard : num_processes(),
          .process_index = mesh ? mesh->index_along("dp", process_index()) : process_index(),
          .split_batches = options_.split_batches,
          .even_batches = options_.even_batches};
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::prepare_module(const std::shared_ptr<torch::nn::Module>& module,
                                                                    const model_options& how) {
  detail::collective_caller caller("prepare");
  if (how.device_placement.value_or(options_.device_placement))
    module->to(device());  // in place: the parameters keep their identity
  precision_.prepare_model(*module);
  if (!how.evaluation_mode) {
    parallel_.use_gather_encoding(precision_.gather_encoding());
    parallel_.prepare_model(*module);  // before registering: a model the processes disagree on is refused
  }
  registry_.add_model(module);
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
  parallel_.zero_grad(optimizer, set_to_none);
}

template <precision_policy Precision, parallel_policy Parallel, accumulation_policy Accumulation>
void accelerator<Precision, Parallel, Accumulation>::before_forward(const torch::nn::Module& module) {
  parallel_.before_forward(module);
}

}  // namespace accel

#if !ACCEL_HEADER_ONLY
#include "detail/common_configurations.hpp"
namespace accel {
ACCEL_BASIC_CONFIGURATIONS(ACCEL_EXTERN_CONFIGURATION)
}  // namespace accel
#endif
