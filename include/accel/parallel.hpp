/// \file
/// Parallel policies: which processes exist, which device each uses, how gradients are synchronised.
///
/// Available policies / when to use:
/// - `accel::single_process`: one process; CUDA device 0 when available (and `options::cpu` is false), else CPU.
/// - `accel::data_parallel<accel::gloo>`: one process per CPU (or node), gradients all-reduced through Gloo.
/// - `accel::data_parallel<accel::nccl>`: one process per GPU, gradients all-reduced through NCCL (link the
///   `accel::nccl` CMake target).
#pragma once

#include <c10/core/Device.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/types.h>  // before clip_grad.h, which uses torch::Tensor without including it
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/config.hpp"
#include "collectives.hpp"
#include "concepts.hpp"
#include "detail/compat.hpp"
#include "detail/support/diagnostics.hpp"
#include "detail/comm/flight_recorder.hpp"
#include "detail/comm/gloo_communicator.hpp"
#include "detail/comm/process_barrier.hpp"
#include "detail/gradient_sync/reducer.hpp"
#include "detail/gradient_sync/uneven_join.hpp"
#include "detail/support/parameter_encoding.hpp"
#include "detail/support/scope.hpp"
#include "launch.hpp"
#include "options.hpp"
#ifdef ACCEL_WITH_NCCL
#include "detail/comm/nccl_communicator.hpp"
#endif

namespace accel {
namespace detail {
/// Stands in for NCCL's communicator in a build without NCCL, so that `data_parallel<nccl>` can be named
/// everywhere and fails with a sentence only where an accelerator is built with it.
template <class Backend>
struct nccl_not_linked : local_communicator {
  template <class... Args>
  explicit nccl_not_linked(const Args&...) {
    static_assert(always_false<Backend>,
                  "accel::data_parallel<accel::nccl> needs NCCL: link the accel::nccl CMake target (NCCL and the "
                  "CUDA runtime, found under /usr/local/cuda, CUDA_HOME or NCCL_ROOT)");
  }
  [[nodiscard]] const process_environment& environment() const noexcept { return env; }
  process_environment env;
};

/// The total `norm_type`-norm of the parameters' gradients, as `clip_grad_norm_` computes it, without clipping.
ACCEL_DECL double gradient_norm(const std::vector<at::Tensor>& parameters, double norm_type);
}  // namespace detail

/// The hooks a parallel policy may leave out (concepts.hpp's facets), with what replicated data parallelism does:
/// every process holds every parameter, gradient and optimizer state in full, and gradients are identical once
/// all-reduced. Derive from it and define what differs: a sharded policy partitions the optimizer at prepare, steps
/// its shard and gathers the parameters, and reduces the overflow check and the gradient norm across processes.
struct parallel_defaults {
  [[nodiscard]] static constexpr std::string_view name() noexcept { return "a custom parallel policy"; }
  /// Accelerate's `distributed_type` value that selects the policy in `accel::dispatch`; empty: none does (only a
  /// run that names none, by its number of processes).
  [[nodiscard]] static constexpr std::string_view distributed_type() noexcept { return ""; }

  // Capabilities: what the policy can do beyond the facets every policy has, declared rather than probed.
  /// Has the uneven inputs facet (begin_join, finish_join, abandon_join): `join_uneven_inputs` may shadow the
  /// processes that ran out of data.
  static constexpr bool joins_uneven_inputs = false;
  /// Each process can step its whole model alone, without the others (`local_sgd`): its optimizer holds the whole
  /// state of full parameters.
  static constexpr bool steps_alone = true;
  /// Between steps each process keeps only its slice (`shard_of`) of each parameter the policy shards
  /// (fully_sharded): `load_state` then reads only those slices of a checkpoint's weights, as it reads only its
  /// slices of the optimizer state of every policy that shards it.
  static constexpr bool keeps_parameter_slices = false;

  // Model preparation.
  /// Forgets every prepared model (`free_memory`).
  static constexpr void release_models() noexcept {}
  /// At prepare, before `prepare_model`: the precision policy's `gather_encoding()`. A policy that keeps every
  /// parameter full has nothing to gather, so nothing to encode.
  static constexpr void use_gather_encoding(const std::shared_ptr<detail::parameter_encoding>&) noexcept {}
  /// Alive around each forward of a prepared model (`tensor_parallel` routes its split layers): nothing here.
  [[nodiscard]] static constexpr detail::no_scope forward_scope() noexcept { return {}; }

  // Optimizer stepping.
  /// At `prepare(optimizer)`, before the accelerator registers it.
  static constexpr void prepare_optimizer(torch::optim::Optimizer&) noexcept {}
  /// Before anything reads `optimizer`'s gradients on a step that synchronises (unscale, clip, step): a sharded
  /// policy gives each shard its slice of the full gradient here.
  static constexpr void attach_gradients(torch::optim::Optimizer&) noexcept {}
  /// The step itself, once the precision policy decided to take it.
  static void step_optimizer(torch::optim::Optimizer& optimizer) { optimizer.step(); }
  /// `prepared_optimizer::zero_grad`: the gradients the optimizer's step reads (a sharded policy clears the full
  /// gradients its shards are slices of).
  static void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
    detail::compat::zero_grad(optimizer, set_to_none);
  }
  /// Whether any process found an inf/NaN gradient, given this one's finding: the same everywhere after the
  /// all-reduce, so no communication.
  [[nodiscard]] static constexpr bool any_non_finite(bool found_here) noexcept { return found_here; }
  /// The total gradient norm of `parameters` over every process's part (a full copy here).
  [[nodiscard]] static double gradient_norm(const std::vector<at::Tensor>& parameters, double norm_type) {
    return detail::gradient_norm(parameters, norm_type);
  }
  /// Scales the gradients so that their total norm is at most `max_norm`; returns the total norm before.
  static double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
    return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
  }

  // Checkpoint participation.
  /// What `save_state` writes: the full state (replicated, it is what every process holds).
  [[nodiscard]] static constexpr state_dict_type checkpoint_format() noexcept { return state_dict_type::full; }
  /// Runs `action` with `module`'s parameters full, keeping what it writes into them (save_state, load_state):
  /// replicated, they always are; a policy that shards parameters gathers them for the while.
  template <class Action>
  static void with_full_parameters(torch::nn::Module&, Action&& action) {
    std::forward<Action>(action)();
  }
  /// Runs `action` with `module`'s parameters as the policy keeps them between steps (load_state and load_model
  /// write into them there, where the policy `keeps_parameter_slices`): replicated, full.
  template <class Action>
  static void with_parameters_at_rest(torch::nn::Module&, Action&& action) {
    std::forward<Action>(action)();
  }
  /// `parameter` with all its elements (get_state_dict): itself, replicated.
  [[nodiscard]] static at::Tensor full_parameter(const at::Tensor& parameter) { return parameter; }
  /// `save_state`, on every process, for each prepared optimizer: `write()` (which the main process uses to write
  /// `optimizer.bin`) with the optimizer holding the job's full state. Replicated, it always does; a sharded policy
  /// gathers it from every process's shard for the while.
  template <class Write>
  static void with_full_optimizer_state(torch::optim::Optimizer&, Write&& write) {
    std::forward<Write>(write)();
  }
  /// `load_state`: `load()` loads a full state into the optimizer; a sharded policy then keeps its shard of it.
  template <class Load>
  static void load_full_optimizer_state(torch::optim::Optimizer&, Load&& load) {
    std::forward<Load>(load)();
  }
  /// This process's slice of `parameter` and its full shape, where the policy shards it; none where it is
  /// replicated (a sharded checkpoint then holds it in full, from the main process).
  [[nodiscard]] static std::optional<parameter_shard> shard_of(const at::Tensor&) { return std::nullopt; }
};

/// One process, one device. Every collective is the identity and nothing is communicated.
struct single_process : parallel_defaults {
  using policy_category = parallel_tag;
  [[nodiscard]] static constexpr std::string_view name() noexcept { return "single_process"; }
  [[nodiscard]] static constexpr std::string_view distributed_type() noexcept { return "NO"; }

  ACCEL_DECL explicit single_process(const options& opts);

  [[nodiscard]] const c10::Device& device() const noexcept { return device_; }
  [[nodiscard]] static constexpr int process_index() noexcept { return 0; }
  [[nodiscard]] static constexpr int local_process_index() noexcept { return 0; }
  [[nodiscard]] static constexpr int num_processes() noexcept { return 1; }
  static constexpr void wait_for_everyone() noexcept {}
  /// Nothing to broadcast or hook with one process.
  static constexpr void prepare_model(torch::nn::Module&) noexcept {}
  [[nodiscard]] static constexpr bool gradient_sync(const torch::nn::Module&) noexcept { return true; }
  static constexpr void set_gradient_sync(const torch::nn::Module&, bool, bool = false) noexcept {}
  static constexpr void before_forward(const torch::nn::Module&) noexcept {}
  [[nodiscard]] static local_communicator communicator() noexcept { return {}; }

 private:
  c10::Device device_;
};

/// Gloo (CPU tensors, any number of processes per machine).
struct gloo {
  using policy_category = backend_tag;
  static constexpr std::string_view name = "gloo";
  /// Whether its all-reduce sums bfloat16 tensors (the bf16 gradient hooks need it): not on LibTorch 1.13's Gloo.
  static constexpr bool sums_bfloat16 = detail::compat::gloo_sums_bfloat16;
  /// Its collectives take CPU tensors: what a communication hook computes, it computes on the CPU.
  static constexpr bool computes_on_cpu = true;
  static constexpr std::string_view distributed_type = "MULTI_CPU";  // data_parallel<gloo>'s, in accel::dispatch
  using communicator_type = detail::gloo_communicator;
  /// Gloo runs on CPU tensors: every process computes on the CPU.
  static c10::Device device(const process_environment&) { return c10::Device(c10::kCPU); }
};

/// NCCL (CUDA tensors, one process per GPU). Needs the `accel::nccl` CMake target (NCCL and the CUDA runtime).
struct nccl {
  using policy_category = backend_tag;
  static constexpr std::string_view name = "nccl";
  static constexpr bool sums_bfloat16 = true;
  static constexpr bool computes_on_cpu = false;
  static constexpr std::string_view distributed_type = "MULTI_GPU";  // data_parallel<nccl>'s, in accel::dispatch
#ifdef ACCEL_WITH_NCCL
  using communicator_type = detail::nccl_communicator;
#else
  using communicator_type = detail::nccl_not_linked<nccl>;
#endif
  /// One GPU per process of a machine: `cuda:LOCAL_RANK`, as Accelerate.
  static c10::Device device(const process_environment& env) {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  }
};

namespace detail {
/// True for a parallel policy that is one process by construction (`single_process`): nothing to shard.
template <class Q>
concept always_one_process = requires { requires std::integral_constant<int, Q::num_processes()>::value == 1; };

/// The process group, created by the first data-parallel accelerator of the process and shared by every later
/// one, as Accelerate's PartialState and PyTorch's default group are. Never destroyed: its threads and sockets
/// would otherwise be torn down during static destruction, in no particular order with what they use. It registers
/// its barrier as the job's (detail/comm/process_barrier.hpp), for the logger's `in_order`, and starts the hang
/// watch where the communicator has one (Gloo's: `options::hang_timeout`, or ACCEL_HANG_TIMEOUT).
template <class Communicator>
Communicator& process_group(std::chrono::milliseconds timeout, std::chrono::milliseconds hang_timeout = {}) {
  static Communicator* const group = [&] {
    auto* created = new Communicator(read_process_environment(), timeout);
    register_process_barrier([created] { created->barrier(); });
    if constexpr (requires { created->start_hang_watch(hang_timeout); })
      created->start_hang_watch(hang_timeout_from_environment(hang_timeout));
    return created;
  }();
  return *group;
}

/// A second process group over the same processes, created from the first once, when first needed (at a prepare,
/// on every process alike), for collectives that must be ordered apart from the first group's: fully_sharded's
/// shard units gather parameters on it during backward, while the gradient reducer reduce-scatters on the first.
template <class Communicator>
auto& separate_process_group(std::chrono::milliseconds timeout) {
  static auto* const group = process_group<Communicator>(timeout).separate("accel/separate").release();
  return *group;
}

/// `options::timeout`, checked: it bounds the rendezvous and every collective, and c10d's store cannot even connect
/// within less than a second (it failed with a misleading "another job may hold the port" message).
ACCEL_DECL std::chrono::milliseconds checked_timeout(std::chrono::milliseconds timeout);
}  // namespace detail

/// Writes this process's flight record (the last collectives of its Gloo process groups,
/// detail/comm/flight_recorder.hpp) into a directory, ACCEL_FLIGHT_RECORDER_DIR by default, as
/// `accel_trace_rank_{rank}` in PyTorch's dump format
/// (`accel fr-trace DIR` and torchfrtrace read it); returns the file's path.
using detail::dump_flight_record;

/// The process topology facet (concepts.hpp) of a policy over the job's process group on `Backend`: the
/// processes the launcher started, this one's device (`Backend::device`: the CPU for Gloo, `cuda:LOCAL_RANK` for
/// NCCL), and the communicator every collective runs on. A building block: derive a parallel policy from it (and
/// from `parallel_defaults`) to have its process queries, barrier and collectives.
template <class Backend>
class process_group_topology {
  static_assert(communication_backend<Backend>,
                "accel::data_parallel<Backend> takes accel::gloo (CPU) or accel::nccl (CUDA) as its backend");

 public:
  using backend_type = Backend;
  using communicator_type = typename Backend::communicator_type;

  explicit process_group_topology(const options& opts)
      : communicator_(
            &detail::process_group<communicator_type>(detail::checked_timeout(opts.timeout), opts.hang_timeout)),
        device_(Backend::device(communicator_->environment())) {}

  [[nodiscard]] const c10::Device& device() const noexcept { return device_; }
  [[nodiscard]] int process_index() const noexcept { return communicator_->rank(); }
  [[nodiscard]] int local_process_index() const noexcept { return communicator_->environment().local_rank; }
  [[nodiscard]] int num_processes() const noexcept { return communicator_->size(); }
  void wait_for_everyone() { communicator_->barrier(); }
  [[nodiscard]] communicator_type& communicator() noexcept { return *communicator_; }

 protected:
  /// Makes `group` (a process group of the mesh, this process among its members) what this facet's collectives, rank
  /// and size are: hybrid sharding shards within its dp_shard group. Before any model is prepared.
  void narrow_to(communicator_type& group) noexcept { communicator_ = &group; }

 private:
  communicator_type* communicator_;
  c10::Device device_;
};

namespace detail {
/// What every multi-process policy over `Backend` shares (data_parallel, and the sharded policies derived from it):
/// the process group, broadcasting process 0's model at prepare, and a gradient reducer per prepared model whose
/// buckets are all-reduced in full or, with the sharded `Layout`, reduce-scattered.
template <class Backend, gradient_layout Layout>
struct bucketed_data_parallel : parallel_defaults, process_group_topology<Backend> {
  using policy_category = parallel_tag;
  using topology = process_group_topology<Backend>;
  using typename topology::communicator_type;
  using reducer_type = gradient_reducer<communicator_type, Layout>;

  explicit bucketed_data_parallel(const options& opts)
      : topology(opts), buckets_(opts.buckets), comm_hook_(opts.comm_hook) {
    if (Layout == gradient_layout::sharded &&
        (comm_hook_.hook != comm_hook::none || comm_hook_.wrapper != comm_wrapper::none))
      throw std::invalid_argument(
          "accel: options::comm_hook compresses the all-reduce of data_parallel and zero1; zero2 and fully_sharded "
          "reduce-scatter their gradient buckets, which no hook applies to: leave options::comm_hook at its default");
    // On one process too, where no reducer (and so no hook) is made.
    check_comm_hook_options(comm_hook_, Backend::sums_bfloat16, Backend::computes_on_cpu);
  }

  /// Broadcasts process 0's parameters and buffers (but those `built_sliced` names: fully_sharded's units built by
  /// accel::construct_sharded), then hooks the gradient all-reduce (with several processes); `group_of` keeps each
  /// gradient bucket within a group of parameters (fully_sharded's units).
  void prepare_model(torch::nn::Module& module, const std::function<std::size_t(const at::Tensor&)>& group_of = {},
                     const std::function<bool(const at::Tensor&)>& built_sliced = {}) {
    check_same_module(module, this->communicator());
    broadcast_module_state(module, this->communicator(), 0, built_sliced);
    if (this->num_processes() > 1)
      reducers_[&module] = std::make_unique<reducer_type>(module, this->communicator(), buckets_, group_of,
                                                          make_bucket_hook<communicator_type>(comm_hook_), replicas_);
  }
  /// Whether backward through `module` all-reduces its gradients (no_sync and accumulation turn it off).
  [[nodiscard]] bool gradient_sync(const torch::nn::Module& module) const {
    auto* reducer = reducer_for(module);
    return reducer == nullptr || reducer->sync();
  }
  /// With `this_backward`, also for the graph already built (`trigger_sync_in_backward`); otherwise from the
  /// next forward on, as DDP.
  void set_gradient_sync(const torch::nn::Module& module, bool enabled, bool this_backward = false) {
    if (auto* reducer = reducer_for(module)) reducer->set_sync(enabled, this_backward);
  }
  /// Before each forward of a prepared model: arms the gradient hooks for its backward, syncs buffers.
  void before_forward(const torch::nn::Module& module) {
    if (auto* reducer = reducer_for(module)) reducer->prepare_for_forward();
  }
  /// Forgets every prepared model: their reducers go, with the hooks on their parameters (`free_memory`).
  void release_models() noexcept { reducers_.clear(); }
  /// The reducer of a prepared model (none with one process), for tools and benchmarks.
  [[nodiscard]] reducer_type* reducer_for(const torch::nn::Module& module) const {
    auto found = reducers_.find(&module);
    return found == reducers_.end() ? nullptr : found->second.get();
  }
  /// Sharded layout: this process's reduced slice of `parameter`'s gradient, kept by the reducer of the prepared
  /// model that holds it; null when none does (one process, or a parameter of no prepared model).
  [[nodiscard]] at::Tensor* shard_gradient(const at::Tensor& parameter) const
    requires(Layout == gradient_layout::sharded)
  {
    for (const auto& [module, reducer] : reducers_)
      if (auto* kept = reducer->shard_gradient(parameter)) return kept;
    return nullptr;
  }

 protected:
  /// Multiplies the gradients of `parameters` this process holds by `coefficient`: a clipping decided over more
  /// processes than this group (tensor parallelism's, across the tp group too).
  static void scale_gradients(const std::vector<at::Tensor>& parameters, double coefficient) {
    at::NoGradGuard no_grad;
    for (const auto& parameter : parameters)
      if (parameter.grad().defined()) parameter.grad().mul_(coefficient);
  }
  /// Hybrid sharding: the reducers made from now on all-reduce each reduced segment across `replicas` too.
  void replicate_gradients_across(communicator_type& replicas) noexcept { replicas_ = &replicas; }

 private:
  bucket_options buckets_;
  comm_hook_options comm_hook_;
  communicator_type* replicas_ = nullptr;
  std::map<const torch::nn::Module*, std::unique_ptr<reducer_type>> reducers_;
};
}  // namespace detail

/// Multi-process data parallelism over `Backend`, as PyTorch's DistributedDataParallel: `prepare` broadcasts
/// process 0's parameters and buffers, and every backward all-reduces the gradients in buckets, overlapped with
/// the rest of backward. The processes, ranks and rendezvous come from the launcher's environment
/// (`accel launch`, torchrun, mpirun, srun; see accel/launch.hpp); a program started alone is a world of one.
template <class Backend>
struct data_parallel : detail::bucketed_data_parallel<Backend, detail::gradient_layout::replicated> {
  using base = detail::bucketed_data_parallel<Backend, detail::gradient_layout::replicated>;
  using base::base;
  [[nodiscard]] static std::string name() { return "data_parallel<" + std::string(Backend::name) + ">"; }
  static constexpr bool joins_uneven_inputs = true;
  [[nodiscard]] static constexpr std::string_view distributed_type() noexcept { return Backend::distributed_type; }

  /// Before each forward of a prepared model: during a join (join_uneven_inputs), a forward of a joined model with
  /// gradients enabled first tells every process that this one is still training; then the reducer is armed.
  void before_forward(const torch::nn::Module& module) {
    auto* reducer = this->reducer_for(module);
    if (reducer == nullptr) return;
    int buffer_source = 0;
    if (join_ && at::GradMode::is_enabled())
      if (const auto m = join_->index_of(module); m >= 0)
        buffer_source = join_->announce_forward(static_cast<std::size_t>(m), reducer->sync());
    reducer->prepare_for_forward(buffer_source);
  }

  /// `join_uneven_inputs` starts (several processes): the forwards of `modules` (prepared models) announce
  /// themselves from now on (detail/gradient_sync/uneven_join.hpp).
  void begin_join(const std::vector<const torch::nn::Module*>& modules) {
    std::vector<std::pair<const torch::nn::Module*, typename base::reducer_type*>> joined;
    for (const auto* module : modules) {
      auto* reducer = this->reducer_for(*module);
      if (reducer == nullptr)
        throw std::invalid_argument(
            "accel::join_uneven_inputs takes models that this accelerator prepared (their prepared form, or the "
            "module handle given to prepare)");
      joined.emplace_back(module, reducer);
    }
    join_ = std::make_unique<detail::uneven_join<typename base::communicator_type, typename base::reducer_type>>(
        this->communicator(), std::move(joined));
  }
  /// `join_uneven_inputs` ends on this process, which has run out of data: it shadows the others until every
  /// process has, then every process takes the joined models' parameters and buffers from the last to finish
  /// (DDP's `_sync_final_model`). Returns that process. A collective.
  int finish_join() {
    const auto join = std::exchange(join_, nullptr);
    const int last = join->shadow_until_all_joined();
    for (const auto* module : join->modules()) detail::broadcast_module_state(*module, this->communicator(), last);
    return last;
  }
  /// An exception left the scope: forget the join without communicating (the job is failing).
  void abandon_join() noexcept { join_.reset(); }

 private:
  std::unique_ptr<detail::uneven_join<typename base::communicator_type, typename base::reducer_type>> join_;
};

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/parallel.ipp"
#endif
