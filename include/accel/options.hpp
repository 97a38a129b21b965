/// \file
/// `accel::options`: the run-time knobs of an accelerator. Decisions that change the generated code are
/// template arguments (the policies); everything here is read once, at construction.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fwd.hpp"

namespace torch::nn {
class Module;
}

namespace accel {

/// How `data_parallel` groups gradients into all-reduces (PyTorch DDP's `bucket_cap_mb` and first-bucket size).
/// Gradients are packed in reverse registration order, the order in which backward usually produces them; the
/// small first bucket lets communication start early.
struct bucket_options {
  double first_bucket_mb = 1.0;
  double bucket_cap_mb = 25.0;
};

/// What a gradient communication hook does to each bucket before (or instead of) its all-reduce (Accelerate's
/// `DDPCommunicationHookType`, PyTorch's DDP comm hooks).
enum class comm_hook {
  /// The bucket is all-reduced as it is.
  none,
  /// Cast to float16 (bfloat16) for the all-reduce and back: half the bytes (`fp16_compress_hook`,
  /// `bf16_compress_hook`).
  fp16,
  bf16,
  /// PowerSGD (`powerSGD_hook`): each gradient matrix sent as a low-rank approximation, with error feedback.
  power_sgd,
  /// PowerSGD of the whole bucket as one square matrix (`batched_powerSGD_hook`): faster, usually less accurate
  /// unless the rank is 1.
  batched_power_sgd,
};
/// A cast around another hook (Accelerate's `DDPCommunicationHookType` for `comm_wrapper`: PyTorch's
/// `fp16_compress_wrapper`, `bf16_compress_wrapper`): the hook runs on the bucket cast to that type. Without a hook
/// it wraps the plain all-reduce (PyTorch's `fp16_compress_wrapper(allreduce_hook)`, the same as the fp16 hook),
/// where Accelerate ignores it.
enum class comm_wrapper { none, fp16, bf16 };

/// PowerSGD's settings (PyTorch's `PowerSGDState`, same defaults; Accelerate's `comm_state_option`).
struct power_sgd_options {
  /// The rank of the approximation of each gradient matrix.
  int matrix_approximation_rank = 1;
  /// Synchronised backward passes all-reduced plainly before compression starts (PyTorch's `start_powerSGD_iter`;
  /// at least 2 with error feedback or warm start).
  int start_power_sgd_iter = 1000;
  /// A matrix is compressed only when that saves at least this factor of its elements.
  double min_compression_rate = 2.0;
  /// Add the previous step's approximation error to the gradient before compressing it.
  bool use_error_feedback = true;
  /// Start each step's power iteration from the last step's Q instead of a random one.
  bool warm_start = true;
  /// Added to the norm when orthogonalising (0: none).
  double orthogonalization_epsilon = 0.0;
  /// Seeds the random Q matrices (the same on every process): NumPy's `RandomState(random_seed)`, below 2^32.
  std::uint64_t random_seed = 0;
  /// Compress the matrices of the same shape in a bucket together, as one batch (more parallel, more memory).
  bool batch_tensors_with_same_shape = false;
};

/// How `data_parallel` communicates gradient buckets (Accelerate's `DistributedDataParallelKwargs` `comm_hook`,
/// `comm_wrapper` and `comm_state_option`).
struct comm_hook_options {
  /// What each bucket's reduction does (`comm_hook`).
  accel::comm_hook hook = accel::comm_hook::none;
  /// The cast around it (`comm_wrapper`).
  accel::comm_wrapper wrapper = accel::comm_wrapper::none;
  /// PowerSGD's settings, read by the two PowerSGD hooks only (`comm_state_option`).
  power_sgd_options power_sgd = {};
};

/// What `save_state` writes under a sharded policy (Accelerate's FSDP `state_dict_type`).
enum class state_dict_type {
  /// The full weights and the full optimizer state, gathered: the same files as `data_parallel`'s.
  full,
  /// Each process its own slices, in files of its own, and a layout table: nothing gathered. Loads under any number
  /// of processes and any parallel policy; `accel merge-weights` writes the full weights.
  sharded,
};

/// How the sharded policies checkpoint, and how `accel::fully_sharded` treats the parameters of each
/// `accel::shard_unit` (Accelerate's FSDP plugin).
struct sharding_options {
  /// What `save_state` writes under zero1, zero2 and fully_sharded (data_parallel always writes the full state).
  accel::state_dict_type state_dict = accel::state_dict_type::full;
  /// Free a unit's full parameters after its forward and gather them again before its backward (Accelerate's
  /// FULL_SHARD, the default): a process holds at most two units' parameters at once. False keeps them from the
  /// forward until the unit's backward is over (SHARD_GRAD_OP): one all-gather per unit and step instead of two.
  bool reshard_after_forward = true;
  /// Start gathering the next unit's parameters (in the order of the last forward; the one before in backward)
  /// while this one computes.
  bool prefetch = true;
};

/// fp16's dynamic loss scaling, PyTorch's GradScaler algorithm (Accelerate's `GradScalerKwargs`, same defaults):
/// the loss is multiplied by `scale` before backward; a step whose gradients hold inf/NaN is skipped and the scale
/// multiplied by `backoff_factor`; after `growth_interval` clean steps in a row it is multiplied by
/// `growth_factor`.
struct grad_scaler_options {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;
};

/// Which float8 types `accel::fp8` casts to (TransformerEngine's `Format`, Accelerate's `fp8_format`): `hybrid`
/// e4m3 for the forward's inputs and weights and e5m2 for the gradients (more range, less precision), `e4m3` or
/// `e5m2` for all three.
enum class fp8_format { hybrid, e4m3, e5m2 };

/// How delayed scaling picks the amax a scale is computed from (TransformerEngine's `amax_compute_algo`): the
/// largest in the history window, or the most recent one.
enum class amax_compute_algo { max, most_recent };

/// `accel::fp8`'s settings, with the names of Accelerate's `TERecipeKwargs` (delayed scaling) and `AORecipeKwargs`
/// (which Linear layers, padding). See docs/fp8.md.
struct fp8_options {
  /// The float8 types; unset: the recipe's own (tensorwise and delayed: hybrid, as torchao's default and
  /// TransformerEngine's; rowwise: e4m3, the only one it takes).
  std::optional<accel::fp8_format> fp8_format = std::nullopt;
  /// `delayed_scaling`: the amaxes kept per tensor, one per optimizer step (TransformerEngine's default 1024).
  int amax_history_len = 1024;
  /// `delayed_scaling`: the amax of the window, or the most recent.
  accel::amax_compute_algo amax_compute_algo = accel::amax_compute_algo::max;
  /// `delayed_scaling`: the scale is divided by 2^margin, headroom for amaxes that grow between updates.
  int margin = 0;
  /// Which Linear layers compute in float8 (Accelerate's `module_filter_func`, torchao's `module_filter_fn`): called
  /// with each Linear whose dimensions are multiples of 16 and its name in the model (`blocks.0.mlp.0`); empty:
  /// Accelerate's `filter_first_and_last_linear_layers` (all but the model's first and last Linear).
  std::function<bool(const torch::nn::Module& linear, const std::string& name)> module_filter_func = {};
  /// Pad the dimension a matmul reduces over to a multiple of 16 with zeros when it is not (torchao's
  /// `pad_inner_dim`, on in Accelerate): the weight gradient reduces over the tokens of the batch, which CUDA's
  /// float8 matmul needs in multiples of 16. The zeros add nothing to the sums.
  bool pad_inner_dim = true;
  /// Compute each float8 matmul as a float32 matmul of the float8 values divided by their scales (torchao's
  /// `Float8LinearConfig.emulate`: the same products, summed in another order) instead of `at::_scaled_mm`. Unset:
  /// emulated on the CPU, whose `_scaled_mm` in LibTorch 2.13 is a reference kernel thousands of times slower than a
  /// bfloat16 matmul (measured: 2048 x 96 by 96 x 384 takes 9.7 s, 1.8 ms in bfloat16), `_scaled_mm` elsewhere.
  std::optional<bool> emulate = std::nullopt;
  /// Under `fully_sharded`, all-gather the converted layers' weights in float8 (Accelerate's and torchao's
  /// `enable_fsdp_float8_all_gather`): the processes agree on each weight's scale (the max of their slices' amaxes),
  /// each casts its slice, the gather moves 1 byte per element instead of the weight's 4 (or 2), and the layer computes
  /// with the gathered float8 weight as it is, instead of casting the full weight. `tensorwise_scaling` only (torchao's
  /// dynamic tensorwise recipe); no effect under a policy that keeps the weights full.
  bool enable_fsdp_float8_all_gather = false;
};

/// Whether a program picks up where an earlier run of it stopped (`automatic_checkpoint_options::resume`).
enum class resume {
  /// Start afresh; `load_state()` loads by hand.
  none,
  /// Load the project's newest complete automatic checkpoint, if there is one, when the first pass over a prepared
  /// range starts: a program restarted by `accel launch --max_restarts` continues mid-epoch.
  latest,
};

/// Which files `save_state` writes (docs/python.md): accel's own (`accel_state.bin`, LibTorch archives, a manifest),
/// or Accelerate's (`optimizer.bin`, `scheduler.bin`, `random_states_{i}.pkl`: PyTorch's state_dicts in
/// `torch.save`'s format), which Accelerate's `load_state` reads. `load_state` reads either, telling them apart by
/// their files.
enum class file_set { accel, accelerate };

/// `save_options::if_in_flight`.
enum class in_flight { wait, skip };

/// `accelerator::save_state`'s options (Accelerate's `save_state` arguments, and `asynchronous`).
struct save_options {
  /// The model files as safetensors (`model.safetensors`); false: Accelerate's pickled `pytorch_model.bin` (a dict
  /// of tensors: `torch.load(path, weights_only=False)` in Python). The sharded format's shards are safetensors.
  bool safe_serialization = true;
  /// `file_set::accelerate`: Accelerate's file set, for a Python program's `accelerator.load_state`. Only
  /// the full format; objects without a PyTorch counterpart accel maps (docs/python.md) are refused.
  file_set files = file_set::accel;
  /// Write in the background (PyTorch DCP's `async_save`): `save_state` copies the training state into CPU memory
  /// (a snapshot, whose buffers are kept for the next save), returns, and a thread writes the checkpoint, with
  /// every guarantee of a save that blocks (atomic, checksummed, every process or none, pruning after a complete
  /// save), over a process group of its own. `accel::wait_for_checkpoint(acc)` waits for it; `wait_for_everyone`,
  /// `end_training`, `load_state`, the next save and the accelerator's destructor do too. A failure is raised on
  /// every process by the first of those. Only accel's own file set.
  bool asynchronous = false;
  /// What an asynchronous save does while the previous one is still being written: wait for it, or skip this save
  /// (every process alike, with a message).
  accel::in_flight if_in_flight = in_flight::wait;
  /// The share of its time an asynchronous save's thread spends writing (0 to 1): it writes in pieces of 4 MiB and
  /// pauses after each, so that the training beside it, which shares the CPUs' caches and memory bandwidth, slows
  /// little (at 0.5 a step slowed by 6% here, at 1 by 18%: docs/performance.md); the write takes 1 / share as long.
  double write_duty_cycle = 0.5;
};

/// `accel::checkpoint_automatically`'s plan (accel/checkpoint.hpp): when the accelerator saves and resumes by itself,
/// into the project's numbered checkpoints.
struct automatic_checkpoint_options {
  /// When positive, `save_state()` every that many optimizer steps, once the step's batch is done (when the
  /// prepared range moves on from it): how much work a failure can cost. Counted over the whole run, a resumed
  /// one included (the count is in the checkpoint).
  std::int64_t every_steps = 0;
  /// `resume::latest`: load the newest complete checkpoint when the first pass over a prepared range starts.
  accel::resume resume = accel::resume::none;
  /// How the saves are made: `{.asynchronous = true}` writes them in the background.
  save_options save = {};
};

/// Where `save_state()` without a path writes (Accelerate's `ProjectConfiguration`): with
/// `automatic_checkpoint_naming`, `{project_dir}/checkpoints/checkpoint_{i}` for i = 0, 1, ..., keeping at most
/// `total_limit` of them (the oldest are removed first; 0: keep all). `load_state()` without a path loads the
/// newest. Trackers write under `{logging_dir}/{project_name}/` (`logging_dir` empty: `project_dir`).
struct project_options {
  std::string project_dir = ".";
  bool automatic_checkpoint_naming = false;
  int total_limit = 0;
  std::string logging_dir = {};
  /// The number of the next automatic checkpoint (Accelerate's `ProjectConfiguration.iteration`): when set,
  /// `save_state()` writes `checkpoint_{iteration}` and counts up from there, refusing a directory that exists.
  /// Unset, the next is numbered after the highest `checkpoint_{i}` there is. After `load_state` of `checkpoint_{k}`,
  /// the next is k + 1 either way.
  std::optional<std::int64_t> iteration = std::nullopt;
  /// Each machine's local main process writes the checkpoint's shared files (models, optimizers, schedulers...) into
  /// the directory on its own disk, instead of the main process alone (Accelerate's `save_on_each_node`): for
  /// machines that share no file system. Every process writes its own `random_states_{rank}.bin` either way.
  bool save_on_each_node = false;
};

/// `accelerator::prepare_model`'s options (Accelerate's `prepare_model` arguments).
struct model_options {
  /// Move the model to `device()`; empty: `options::device_placement`.
  std::optional<bool> device_placement = std::nullopt;
  /// A model used only for inference: placed (and autocast by the precision policy) but not given to the parallel
  /// policy: no broadcast of process 0's weights, no gradient synchronisation, no sharding. Its weights are still
  /// saved by `save_state`.
  bool evaluation_mode = false;
};

/// `accelerator::join_uneven_inputs`' options.
struct join_options {
  /// Overrides `options::even_batches` for the prepared ranges' passes begun within the scope (restored after);
  /// empty: as the accelerator's. Join is active (processes that run out of data shadow the others) when it is
  /// false.
  std::optional<bool> even_batches = std::nullopt;
};

/// How context parallelism passes keys and values around the "cp" group (accel/context_parallel.hpp): all of them
/// gathered at once (PyTorch's default), or one part to the next process per step (its "alltoall" rotation).
enum class cp_comm_strategy { allgather, alltoall };

/// The device mesh given in the program (Accelerate's `ParallelismConfig(dp_replicate_size=..., dp_shard_size=...,
/// tp_size=..., cp_size=...)`, passed as `Accelerator(parallelism_config=...)`): a size set here is the mesh's; an
/// unset one is read from its PARALLELISM_CONFIG_*_SIZE, as Accelerate reads its unset fields. Nothing set: the
/// environment alone decides whether there is a mesh (accel/device_mesh.hpp, `configured_mesh`).
struct parallelism_options {
  std::optional<int> dp_replicate_size = std::nullopt;
  std::optional<int> dp_shard_size = std::nullopt;
  std::optional<int> tp_size = std::nullopt;
  std::optional<int> cp_size = std::nullopt;
  /// Pipeline stages (accel/pipeline.hpp): not in Accelerate's ParallelismConfig, named as its sizes are.
  std::optional<int> pp_size = std::nullopt;
  /// How context parallelism's ring passes keys and values (Accelerate's `cp_comm_strategy`); unset:
  /// PARALLELISM_CONFIG_CP_COMM_STRATEGY, else all-gather.
  std::optional<accel::cp_comm_strategy> cp_comm_strategy = std::nullopt;
};

/// The experiment trackers built into accel (see accel/tracking.hpp), for `options::log_with`.
enum class tracker { csv, json_lines, tensorboard, mlflow };

/// How long the MLflow tracker (`log_with = {tracker::mlflow}`) waits for its server: MLflow's client's own bounds by
/// default, so that a slow server gets every value. MLflow's variables MLFLOW_HTTP_REQUEST_TIMEOUT (seconds) and
/// MLFLOW_HTTP_REQUEST_MAX_RETRIES, where set, take precedence (docs/trackers.md).
struct mlflow_options {
  /// From sending a request to the end of its answer (MLflow's 120 s).
  std::chrono::milliseconds request_timeout = std::chrono::seconds(120);
  /// Once training has ended, a request the server does not take is given up after this many retries (MLflow's 7);
  /// while training runs, requests are retried as long as it does.
  int max_retries = 7;
  /// The longest `end_training` waits for the requests still queued, in all; none: as long as the server takes them
  /// within their retries.
  std::optional<std::chrono::milliseconds> finish_timeout = std::nullopt;
};

/// Plain aggregate, so that `accel::accelerator<> acc{{.cpu = true}};` reads as configuration.
struct options {
  /// Run on the CPU even when CUDA is available (Accelerate's `cpu=True`).
  bool cpu = false;
  /// Let `prepare()` move models and batches to `device()` (Accelerate's `device_placement`). Turn it off when
  /// the program places tensors itself.
  bool device_placement = true;
  /// How long rendezvous and each collective may wait for the other processes before raising (Accelerate's
  /// `InitProcessGroupKwargs.timeout`; 30 minutes as there). Used by the first accelerator of the process, which
  /// creates the process group.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  /// How long a Gloo collective may stay incomplete before the hang watch ends the process, every process having
  /// dumped its flight record (ACCEL_FLIGHT_RECORDER_DIR) and the stuck collective named on stderr; 0 turns the watch
  /// off. 10 minutes, PyTorch's NCCL timeout: well below `timeout`, which would end the job 30 minutes later with no
  /// name, and above the waits a job means (process 0 preparing data for the others, `main_process_first`); raise
  /// it for longer ones. ACCEL_HANG_TIMEOUT (seconds) wins. Used by the first accelerator of the process, as `timeout`.
  std::chrono::milliseconds hang_timeout = std::chrono::minutes(10);
  /// The straggler report: every this many optimizer steps, each process's own work per step (its wall time less its
  /// waits for collectives) is compared across the processes; one more than 1.5x the fastest is named in a warning
  /// on stderr, and the slowest's ratio is logged to the trackers as `straggler/slowest_ratio` (with
  /// `straggler/slowest_process`). One all-gather of a number per window; 0 (the default) turns it off. On NCCL,
  /// whose collectives do not block the host, a process's figure is its host's time.
  std::int64_t straggler_window = 0;
  /// Gradient bucketing of `data_parallel` (Accelerate's `DistributedDataParallelKwargs`).
  bucket_options buckets = {};
  /// Gradient compression of `data_parallel`'s buckets (fp16, bf16, PowerSGD).
  comm_hook_options comm_hook = {};
  /// What `fully_sharded` does with the parameters of its shard units (accel/shard_unit.hpp).
  sharding_options sharding = {};
  /// Loss scaling of `accel::fp16`.
  grad_scaler_options grad_scaler = {};
  /// The recipe settings of `accel::fp8` (Accelerate's `TERecipeKwargs` and `AORecipeKwargs`).
  fp8_options fp8 = {};
  /// Where checkpoints go (`save_state()` / `load_state()` without a path).
  project_options project = {};

  // Gradient accumulation (Accelerate's GradientAccumulationPlugin and DataLoaderConfiguration).

  /// Micro-batches per optimizer step for `accel::accumulate_dynamic` (the environment variable
  /// ACCELERATE_GRADIENT_ACCUMULATION_STEPS wins). With `accumulate<N>` it may only repeat N.
  std::optional<int> gradient_accumulation_steps = std::nullopt;
  /// Force a synchronised step on the last batch of a prepared range, so windows never span passes.
  bool sync_with_dataloader = true;
  /// All-reduce gradients on every micro-batch (the optimizer still steps every N): less memory under some
  /// sharding schemes, more communication.
  bool sync_each_batch = false;
  /// Each batch of a prepared range is split between the processes instead of each process taking whole
  /// batches; a prepared LR scheduler then steps once per optimizer step instead of `num_processes()` times.
  bool split_batches = false;
  // Sharding of prepared ranges under data_parallel (Accelerate's DataLoaderConfiguration; see accel/shard.hpp).

  /// Complete the last round of batches by looping back to the first samples, so every process gets as many full
  /// batches as the others.
  bool even_batches = true;
  /// Under `data_parallel`, process 0 alone reads a prepared range of batches and sends each global batch (P of
  /// its batches, or one with `split_batches`) to every process, which keeps its slice (Accelerate's
  /// `dispatch_batches`, `DataLoaderDispatcher`): for a range only process 0 can read (a stream, a socket, a file
  /// on one node). Not for an `accel::data_loader`, which reads only each process's samples already.
  bool dispatch_batches = false;
  /// The batch size and drop_last of a prepared range of batches, for ranges that do not say (an
  /// `accel::data_loader` does); without it, the first batch's size is taken.
  std::optional<std::int64_t> batch_size = std::nullopt;
  bool drop_last = false;
  /// Batches are copied to a CUDA device without blocking the host (Accelerate's `non_blocking`). A prepared range
  /// places the next batch while the current one is in use, so with a data loader's `pin_memory` that copy
  /// overlaps the work on the current batch. Nothing changes on the CPU.
  bool non_blocking = false;
  /// A prepared LR scheduler steps with the optimizer (only when it really stepped, `num_processes()` times
  /// unless `split_batches`); false: every `step()` call steps it once, as written.
  bool step_scheduler_with_optimizer = true;
  /// The trackers `init_trackers` starts on the main process (Accelerate's `log_with`); empty: none.
  std::vector<tracker> log_with = {};
  /// The MLflow tracker's bounds, for `log_with = {tracker::mlflow}`.
  mlflow_options mlflow = {};
  /// The device mesh of N-D parallelism given in the program (Accelerate's `parallelism_config`); each size left
  /// unset comes from the environment (`accel launch --parallelism_config_*`, PARALLELISM_CONFIG_*_SIZE).
  parallelism_options parallelism_config = {};
};

}  // namespace accel
