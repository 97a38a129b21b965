/// \file
/// Big-model inference, as Accelerate's `big_modeling` module: `accel::init_empty_weights` builds a model without
/// allocating its weights (meta tensors); `accel::dispatch_model`, `accel::load_checkpoint_and_dispatch`,
/// `accel::cpu_offload` and `accel::disk_offload` place each part of it by a device map (accel/device_map.hpp): on a
/// GPU, in CPU memory, or on disk, where its weights stay in a safetensors file and are read in for their own forward
/// only (Accelerate's `AlignDevicesHook`), then let go.
///
///     MyModel model{nullptr};  // what may go to disk is inside an accel::shard_unit: its forward brings it in
///     {
///       accel::init_empty_weights empty;  // nothing allocated: every parameter is on the meta device
///       model = MyModel();
///     }
///     const auto dispatched = accel::load_checkpoint_and_dispatch(
///         *model, "model.safetensors", {.planning = {.max_memory = {{accel::map_device::cpu(), 2LL << 30}}}});
///     auto logits = model->forward(tokens);  // keep `dispatched` alive while the model runs
///
/// The hook: a LibTorch module has no forward hooks, so the seam is `accel::shard_unit` (shard_unit.hpp), whose
/// forward runs between the `unit_hooks` attached to it. The returned `accel::dispatched_model` owns the hooks; the
/// units hold them weakly, so that dropping the handle detaches them.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fcntl.h>
#include <torch/cuda.h>
#include <torch/library.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "detail/config.hpp"
#include "checkpoint_error.hpp"
#include "device_map.hpp"
#include "module_tree.hpp"
#include "safetensors.hpp"
#include "shard_unit.hpp"

namespace accel {
namespace detail::big_modeling {

/// The dispatch key `init_empty_weights` turns on for its thread: DeferredInit, which LibTorch keeps for deferred
/// construction (torchdistx's) and on which nothing registers kernels in a C++ program. No tensor carries it, so its
/// kernel runs only while a scope has included it in this thread's keys.
inline constexpr c10::DispatchKey meta_key = c10::DispatchKey::DeferredInit;

ACCEL_DECL bool mentions_tensor(const c10::TypePtr& type);

/// The kernel for every operator on `meta_key`: an operator that makes a tensor from nothing (it has a `device`
/// argument and no tensor argument: `empty`, `empty_strided`, `zeros`, `full`, `arange`, ...) makes it on the meta
/// device; every other operator goes on unchanged (an init op on a meta tensor is then the meta kernel's no-op).
ACCEL_DECL void made_on_meta(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

/// Registers `made_on_meta` on `meta_key` for every operator, once per process (for the process's life, as
/// LibTorch's own registrations).
ACCEL_DECL void install_meta_factories();

/// Points `tensor` (a parameter, the very object a module holds) at `data`'s storage, shape and device, keeping its
/// autograd identity: what `Tensor::set_data` does after its type check, which refuses a meta tensor's data for a
/// CPU one's and back (LibTorch's modules keep their parameters as members, so the object cannot be replaced).
inline void point_at(const at::Tensor& tensor, const at::Tensor& data) {
  tensor.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
}

/// Where one tensor's bytes lie in a safetensors file.
struct stored_tensor {
  std::filesystem::path file;
  std::uint64_t offset = 0;  ///< of its first byte in the file
  std::uint64_t bytes = 0;
  at::ScalarType type = at::kFloat;
  std::vector<std::int64_t> shape;
};
using stored_tensors = std::map<std::string, stored_tensor>;

/// Adds the tensors of the safetensors file `file` (its header only is read), each checked within the file.
ACCEL_DECL void add_stored(stored_tensors& out, const std::filesystem::path& file);

/// The tensors of a checkpoint: a `.safetensors` file, a Hugging Face `model.safetensors.index.json` (and the files
/// it names), or a directory holding either.
ACCEL_DECL stored_tensors locate_checkpoint(const std::filesystem::path& where);

/// Ranged reads (pread) of stored tensors, each file opened once and kept open while the reader lives, under a shared
/// lock (flock) that tells a dispatch about to replace the file that a live model still reads it.
class tensor_reader {
 public:
  tensor_reader() = default;
  tensor_reader(const tensor_reader&) = delete;
  tensor_reader& operator=(const tensor_reader&) = delete;
  ~tensor_reader() {
    for (const auto& [path, fd] : files_) ::close(fd);
  }

  /// A new CPU tensor holding `stored`'s bytes.
  ACCEL_DECL at::Tensor read(const stored_tensor& stored);
  /// Opens `file` now (its lock taken), so that what is read later is this file even if another is renamed over it.
  void keep_open(const std::filesystem::path& file) { (void)descriptor(file); }
  [[nodiscard]] std::int64_t bytes_read() const noexcept { return bytes_read_; }

 private:
  ACCEL_DECL int descriptor(const std::filesystem::path& file);

  std::map<std::filesystem::path, int> files_;
  std::int64_t bytes_read_ = 0;
};

/// One tensor a unit brings in for its forward: from disk (`stored`), or its copy at rest moved to the execution
/// device (cpu_offload to a GPU).
struct brought_in {
  at::Tensor tensor;  ///< the module's own parameter
  std::optional<stored_tensor> stored;
  at::Tensor at_rest;  ///< what it holds between forwards: meta (disk), or its CPU copy
  c10::Device execution{c10::kCPU};
};

/// The hooks of a dispatched model's units: before a unit's forward its tensors are read in (or moved) to the
/// execution device, after it they go back to what they hold at rest.
class offload_hooks final : public unit_hooks {
 public:
  /// Opens the files of the tensors it brings in at once: they are read from these files, held for the hooks' life.
  ACCEL_DECL explicit offload_hooks(std::vector<std::vector<brought_in>> units);

  ACCEL_DECL void before_unit_forward(std::size_t unit) override;
  void after_unit_forward(std::size_t unit, bool) override {
    for (const auto& slot : units_.at(unit)) point_at(slot.tensor, slot.at_rest);
  }
  void before_unit_backward(std::size_t) override {}  // inference: nothing is let go before backward

  [[nodiscard]] std::int64_t bytes_read() const noexcept { return reader_.bytes_read(); }

 private:
  std::vector<std::vector<brought_in>> units_;
  tensor_reader reader_;
};

/// One tensor of a model as a device map places it: its first name (a tied parameter's other names are the same
/// tensor), where it rests, and the innermost `accel::shard_unit` holding it (none: `unit` empty).
struct placed_tensor {
  std::string name;
  at::Tensor tensor;
  bool parameter = true;
  map_device device;
  std::optional<std::size_t> unit;
};

ACCEL_DECL bool is_under(const std::string& name, const std::string& prefix);

/// The units of `model` (the root included), by name.
ACCEL_DECL std::vector<std::pair<std::string, shard_unit_base*>> units_of(torch::nn::Module& model);

/// The device of the map's most specific entry over `name` (Accelerate's lookup: a module's entry covers its tensors).
ACCEL_DECL map_device device_for(const device_map& map, const std::string& name, const std::string& caller);

/// The innermost of `units` that holds `name`.
ACCEL_DECL std::optional<std::size_t> innermost_unit(const std::vector<std::pair<std::string, shard_unit_base*>>& units,
                                                     const std::string& name);

/// Throws unless every key of `map` names a module, parameter or buffer of `model` (or is "", the whole model): a key
/// that names nothing (a typo) would place nothing, silently (Accelerate warns; accel refuses, naming it).
ACCEL_DECL void check_map_keys(const torch::nn::Module& model, const device_map& map, const std::string& caller);

/// Every parameter and buffer of `model` once, with its device and its innermost unit. A tied parameter (the same
/// tensor under a second name) is placed by its first name; should its other name lie in another unit while it is
/// mapped to disk, that unit's forward would find it gone: refused, naming both.
ACCEL_DECL std::vector<placed_tensor> place(torch::nn::Module& model, const device_map& map, const std::string& caller);

/// The LibTorch device of a map device that holds tensors in memory (a GPU needs CUDA: refused where it is missing).
ACCEL_DECL c10::Device memory_device(const map_device& device, const std::string& caller);

/// Throws unless `stored` holds `tensor` as the model has it (shape and dtype).
ACCEL_DECL void check_stored(const stored_tensors& stored, const placed_tensor& item, const std::string& where);

/// Where a dispatch reads each tensor from: `checkpoint` (load_checkpoint_and_dispatch: every tensor), and for the
/// tensors mapped to disk, `offload` (given, or written by `write_offloaded`).
struct weight_sources {
  const stored_tensors* checkpoint = nullptr;
  stored_tensors offload;
};

/// Refuses a dispatch that cannot be done, before anything of the model changes: a GPU this machine lacks, a tensor
/// on disk outside every unit (or resting on the CPU and running on a GPU outside every unit), a meta tensor with
/// nothing to load it from.
ACCEL_DECL void check_placement(const std::vector<placed_tensor>& placed, const weight_sources& sources,
                                c10::Device execution, const std::string& caller);

/// Throws unless `file` is free to be replaced: no live dispatched model reads it (it holds the file's shared lock).
ACCEL_DECL void check_not_in_use(const std::filesystem::path& file, const std::string& caller);

/// Writes the disk-mapped tensors that have no file yet to `folder`/offload.safetensors and returns where they lie;
/// refused while another live dispatch reads that file (`check_not_in_use`): it would compute with these weights.
ACCEL_DECL stored_tensors write_offloaded(const std::vector<placed_tensor>& placed, const weight_sources& sources,
                                          const std::filesystem::path& folder, const std::string& caller);

/// Moves every tensor where the map places it and makes the units' hooks: a tensor in memory is loaded (from the
/// checkpoint) or moved to its device; one on disk lets its data go (meta) and is listed for its unit's forward, to
/// be read in on `execution`; with `execution` off the CPU, a unit's CPU tensors are moved there for its forward.
ACCEL_DECL std::shared_ptr<offload_hooks> apply(const std::vector<placed_tensor>& placed, const weight_sources& sources,
                                                std::size_t units, c10::Device execution, const std::string& caller);

/// Accelerate's main device: the map's first GPU, else the CPU.
ACCEL_DECL c10::Device main_device(const device_map& map, const std::optional<c10::Device>& given,
                                   const std::string& caller);

/// Throws unless `stored` holds exactly the model's tensors (every name of a tied one accepted), each with its shape
/// and dtype: checked before anything is read or changed.
ACCEL_DECL void check_checkpoint(torch::nn::Module& model, const std::vector<placed_tensor>& placed,
                                 const stored_tensors& stored, const std::string& where);
}  // namespace detail::big_modeling

/// Builds modules without allocating their weights, while it lives (Accelerate's `init_empty_weights()` context
/// manager, or `init_on_device(torch.device("meta"), include_buffers=True)`): every tensor made from nothing on this
/// thread (`torch::empty`, `zeros`, `ones`, `full`, `randn`, `arange`, ...; what a module's constructor and `reset()`
/// make) is made on the meta device, whatever device was asked, and the initialisers on them do nothing:
///
///     MyModel model{nullptr};
///     { accel::init_empty_weights empty; model = MyModel(); }  // shapes and dtypes, no bytes
///
/// Buffers go to meta too (Accelerate's default keeps them; LibTorch offers no `register_parameter` to patch):
/// `load_checkpoint_and_dispatch` loads them with the weights. Operations on tensors that already exist are not
/// changed (a CPU tensor stays one), but a CPU result they allocate through `empty` would be made on meta, so compute
/// outside the scope.
class [[nodiscard]] init_empty_weights {
 public:
  ACCEL_DECL init_empty_weights();
  init_empty_weights(const init_empty_weights&) = delete;
  init_empty_weights& operator=(const init_empty_weights&) = delete;
  ACCEL_DECL ~init_empty_weights();

 private:
  bool was_included_;
  bool was_excluded_;
};

/// A model placed by a device map (`dispatch_model` and the functions built on it): it owns the hooks of the model's
/// units that bring their offloaded weights in for their forward. Keep it alive while the model runs; when it goes,
/// the units only forward (their disk-mapped parameters then stay on the meta device).
class [[nodiscard]] dispatched_model {
 public:
  dispatched_model(device_map map, std::shared_ptr<detail::big_modeling::offload_hooks> hooks)
      : map_(std::move(map)), hooks_(std::move(hooks)) {}

  /// Where each part of the model is (Accelerate's `model.hf_device_map`).
  [[nodiscard]] const device_map& map() const noexcept { return map_; }
  /// Bytes the units' forwards have read from disk so far.
  [[nodiscard]] std::int64_t disk_bytes_read() const noexcept { return hooks_->bytes_read(); }

 private:
  device_map map_;
  std::shared_ptr<detail::big_modeling::offload_hooks> hooks_;
};

/// Options of `dispatch_model` (Accelerate's `dispatch_model(model, device_map, main_device, offload_dir,
/// offload_index)`).
struct dispatch_options {
  /// Where the weights of disk-mapped modules are written (`offload.safetensors`) before they are let go
  /// (Accelerate's `offload_dir`). Not needed with `offload_weights`. One folder per live model: a dispatch into
  /// a folder whose file another live dispatched model reads is refused.
  std::filesystem::path offload_folder{};
  /// A safetensors checkpoint (a file, Hugging Face's `model.safetensors.index.json`, or a directory holding either)
  /// that already holds the disk-mapped weights: they are read from there and nothing is written (Accelerate's
  /// `offload_index` over a safetensors checkpoint). Buffers still on the meta device are read from it too.
  std::filesystem::path offload_weights{};
  /// Where the units run (Accelerate's `main_device` / `execution_device`): by default the map's first GPU, else the
  /// CPU.
  std::optional<c10::Device> execution_device{};
};

namespace detail::big_modeling {
/// The handle of a dispatch: `hooks` attached to every unit of `model` (replacing any hooks attached before).
ACCEL_DECL dispatched_model attached(torch::nn::Module& model, device_map map, std::shared_ptr<offload_hooks> hooks);
}  // namespace detail::big_modeling

/// Places `model`'s parameters and buffers by `map` (Accelerate's `dispatch_model`): GPU entries are moved to their
/// GPU, CPU entries stay in memory, and disk entries are written to `options.offload_folder` (or found in
/// `options.offload_weights`) and let go: the `accel::shard_unit` holding them reads them in (ranged reads) for its
/// own forward, on the execution device, and lets them go after it. A disk entry must be inside a unit (or be one):
/// otherwise this throws naming it and the fix, before anything changes. On a GPU machine, CPU entries in a unit are
/// moved to the execution device for their forward as well; inputs are not moved (give each unit its inputs on its
/// device). Buffers stay in memory (on the execution device for CPU and disk entries).
// The dispatching functions are function objects, as device_map.hpp's planners: argument-dependent lookup finds no
// object, so a program's own function of one of these names, called unqualified with accel's types, stays its own.

struct dispatch_model_function {
  ACCEL_DECL dispatched_model operator()(torch::nn::Module& model, device_map map,
                                         const dispatch_options& options = {}) const;
};
inline constexpr dispatch_model_function dispatch_model{};

/// Options of `load_checkpoint_and_dispatch`.
struct checkpoint_dispatch_options {
  /// Where each part goes; empty: planned by `infer_auto_device_map` with `planning` (Accelerate's
  /// `device_map="auto"` and the others: `planning.strategy`, `max_memory`, `no_split_module_classes`).
  device_map map{};
  device_map_options planning{};
  /// As `dispatch_options::execution_device`.
  std::optional<c10::Device> execution_device{};
};

/// Loads a safetensors checkpoint into `model` (typically built under `init_empty_weights`) and dispatches it
/// (Accelerate's `load_checkpoint_and_dispatch`): `checkpoint` is a `.safetensors` file, Hugging Face's
/// `model.safetensors.index.json` or a directory holding either. Every parameter and buffer must be there with its
/// shape and dtype, and nothing else (checked from the headers before anything is read). Tensors in memory are read
/// in (ranged reads of their bytes); disk entries stay in the checkpoint's own files, as Accelerate offloads from a
/// safetensors checkpoint, so nothing is written (no offload folder is needed).
struct load_checkpoint_and_dispatch_function {
  ACCEL_DECL dispatched_model operator()(torch::nn::Module& model, const std::filesystem::path& checkpoint,
                                         const checkpoint_dispatch_options& options) const;
};
inline constexpr load_checkpoint_and_dispatch_function load_checkpoint_and_dispatch{};

/// Keeps every weight in CPU memory and runs each unit on `execution_device` (Accelerate's `cpu_offload`): on a GPU,
/// each unit's weights are moved there for its forward and let go after it, so that the GPU holds one unit's weights
/// at a time (every parameter must then be in a unit). On the CPU the weights simply stay where they are.
struct cpu_offload_function {
  ACCEL_DECL dispatched_model operator()(torch::nn::Module& model, c10::Device execution_device = c10::kCPU) const;
};
inline constexpr cpu_offload_function cpu_offload{};

/// Writes every weight to `offload_dir`/offload.safetensors, lets it go, and reads each unit's back for its forward
/// only, on `execution_device` (Accelerate's `disk_offload`). Every parameter must be in a unit (`accel::shard_unit`);
/// buffers stay in memory. One folder per live model: while the returned handle lives, another dispatch into
/// `offload_dir` is refused (it would replace the file this model reads).
struct disk_offload_function {
  ACCEL_DECL dispatched_model operator()(torch::nn::Module& model, const std::filesystem::path& offload_dir,
                                         c10::Device execution_device = c10::kCPU) const;
};
inline constexpr disk_offload_function disk_offload{};

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/big_modeling.ipp"
#endif
