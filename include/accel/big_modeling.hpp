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

inline bool mentions_tensor(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  const auto contained = type->containedTypes();
  return std::any_of(contained.begin(), contained.end(), [](const c10::TypePtr& t) { return mentions_tensor(t); });
}

/// The kernel for every operator on `meta_key`: an operator that makes a tensor from nothing (it has a `device`
/// argument and no tensor argument: `empty`, `empty_strided`, `zeros`, `full`, `arange`, ...) makes it on the meta
/// device; every other operator goes on unchanged (an init op on a meta tensor is then the meta kernel's no-op).
inline void made_on_meta(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const auto base = stack->size() - arguments.size();
  std::optional<std::size_t> device, pin_memory;
  bool from_tensors = false;
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() == "device") device = i;
    if (arguments[i].name() == "pin_memory") pin_memory = i;
    from_tensors = from_tensors || mentions_tensor(arguments[i].type());
  }
  if (!device || from_tensors)
    return op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, meta_key), stack);
  (*stack)[base + *device] = c10::IValue(c10::Device(c10::kMeta));
  if (pin_memory) (*stack)[base + *pin_memory] = c10::IValue();
  c10::impl::ExcludeDispatchKeyGuard outside(meta_key);
  op.callBoxed(stack);  // the keys again, now from the meta device
}

/// Registers `made_on_meta` on `meta_key` for every operator, once per process (for the process's life, as
/// LibTorch's own registrations).
inline void install_meta_factories() {
  static const bool installed = [] {
    if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(meta_key))
      throw std::runtime_error(
          "accel::init_empty_weights makes tensors on the meta device through LibTorch's DeferredInit dispatch key, "
          "which something else in this process (torchdistx's deferred_init?) already uses");
    auto* library = new torch::Library(torch::Library::IMPL, "_", meta_key, __FILE__, __LINE__);
    library->fallback(torch::CppFunction::makeFromBoxedFunction<&made_on_meta>());
    return true;
  }();
  (void)installed;
}

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
inline void add_stored(stored_tensors& out, const std::filesystem::path& file) {
  const auto header = safetensors::detail::read_header(file);
  const auto size = std::filesystem::file_size(file);
  for (const auto& [name, entry] : header.entries) {
    const auto type = safetensors::detail::scalar_type_of(entry.dtype);
    if (!type)
      throw checkpoint_error("accel: " + file.string() + ": " + name + " has the unknown dtype " + entry.dtype);
    const auto bytes = c10::multiply_integers(entry.shape) * static_cast<std::int64_t>(c10::elementSize(*type));
    if (entry.offsets.size() != 2 || entry.offsets[1] - entry.offsets[0] != bytes ||
        header.data_begin + static_cast<std::uint64_t>(entry.offsets[1]) > size)
      throw checkpoint_error("accel: " + file.string() + " is corrupt: " + name +
                             "'s bytes do not match its shape or lie outside the file");
    const stored_tensor stored{.file = file,
                               .offset = header.data_begin + static_cast<std::uint64_t>(entry.offsets[0]),
                               .bytes = static_cast<std::uint64_t>(bytes),
                               .type = *type,
                               .shape = entry.shape};
    if (!out.emplace(name, stored).second)
      throw checkpoint_error("accel: " + name + " is in " + out.at(name).file.string() + " and in " + file.string() +
                             "; a checkpoint holds each tensor once");
  }
}

/// The tensors of a checkpoint: a `.safetensors` file, a Hugging Face `model.safetensors.index.json` (and the files
/// it names), or a directory holding either.
inline stored_tensors locate_checkpoint(const std::filesystem::path& where) {
  auto file = where;
  if (std::filesystem::is_directory(where))
    file = std::filesystem::exists(where / "model.safetensors.index.json") ? where / "model.safetensors.index.json"
                                                                           : where / "model.safetensors";
  if (!std::filesystem::exists(file))
    throw checkpoint_error("accel: " + file.string() +
                           " does not exist; give a .safetensors file, a model.safetensors.index.json or a directory "
                           "holding one");
  stored_tensors tensors;
  if (file.string().ends_with(".json")) {
    for (const auto& part : safetensors::detail::index_files(file)) add_stored(tensors, part);
  } else {
    add_stored(tensors, file);
  }
  return tensors;
}

/// Ranged reads (pread) of stored tensors, each file opened once and kept open while the reader lives.
class tensor_reader {
 public:
  tensor_reader() = default;
  tensor_reader(const tensor_reader&) = delete;
  tensor_reader& operator=(const tensor_reader&) = delete;
  ~tensor_reader() {
    for (const auto& [path, fd] : files_) ::close(fd);
  }

  /// A new CPU tensor holding `stored`'s bytes.
  at::Tensor read(const stored_tensor& stored) {
    auto out = at::empty(stored.shape, at::TensorOptions().dtype(stored.type));
    auto* into = static_cast<char*>(out.data_ptr());
    const int fd = descriptor(stored.file);
    for (std::uint64_t done = 0; done < stored.bytes;) {
      const auto got = ::pread(fd, into + done, stored.bytes - done, static_cast<off_t>(stored.offset + done));
      if (got <= 0)
        throw checkpoint_error("accel: cannot read " + std::to_string(stored.bytes) + " bytes at " +
                               std::to_string(stored.offset) + " of " + stored.file.string() +
                               " (truncated or removed since it was dispatched?)");
      done += static_cast<std::uint64_t>(got);
    }
    bytes_read_ += static_cast<std::int64_t>(stored.bytes);
    return out;
  }
  [[nodiscard]] std::int64_t bytes_read() const noexcept { return bytes_read_; }

 private:
  int descriptor(const std::filesystem::path& file) {
    const auto found = files_.find(file);
    if (found != files_.end()) return found->second;
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw checkpoint_error("accel: cannot open " + file.string() + " for reading (missing file?)");
    return files_.emplace(file, fd).first->second;
  }

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
  explicit offload_hooks(std::vector<std::vector<brought_in>> units) : units_(std::move(units)) {}

  void before_unit_forward(std::size_t unit) override {
    for (const auto& slot : units_.at(unit)) {
      auto data = slot.stored ? reader_.read(*slot.stored) : slot.at_rest;
      point_at(slot.tensor, data.device() == slot.execution ? data : data.to(slot.execution));
    }
  }
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

inline bool is_under(const std::string& name, const std::string& prefix) {
  return prefix.empty() || name == prefix || (name.starts_with(prefix) && name[prefix.size()] == '.');
}

/// The units of `model` (the root included), by name.
inline std::vector<std::pair<std::string, shard_unit_base*>> units_of(torch::nn::Module& model) {
  std::vector<std::pair<std::string, shard_unit_base*>> units;
  if (auto* root = dynamic_cast<shard_unit_base*>(&model)) units.emplace_back("", root);
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (auto* unit = dynamic_cast<shard_unit_base*>(item.value().get())) units.emplace_back(item.key(), unit);
  return units;
}

/// The device of the map's most specific entry over `name` (Accelerate's lookup: a module's entry covers its tensors).
inline map_device device_for(const device_map& map, const std::string& name, const std::string& caller) {
  const std::pair<std::string, map_device>* best = nullptr;
  for (const auto& entry : map)
    if (is_under(name, entry.first) && (best == nullptr || entry.first.size() > best->first.size())) best = &entry;
  if (best == nullptr)
    throw device_map_error(caller + ": the device map places nothing of " + name +
                           "; map it, or a module holding it (\"\" maps the whole model)");
  return best->second;
}

/// The innermost of `units` that holds `name`.
inline std::optional<std::size_t> innermost_unit(const std::vector<std::pair<std::string, shard_unit_base*>>& units,
                                                 const std::string& name) {
  std::optional<std::size_t> found;
  for (std::size_t u = 0; u < units.size(); ++u)
    if (is_under(name, units[u].first) && (!found || units[u].first.size() >= units[*found].first.size())) found = u;
  return found;
}

/// Every parameter and buffer of `model` once, with its device and its innermost unit. A tied parameter (the same
/// tensor under a second name) is placed by its first name; should its other name lie in another unit while it is
/// mapped to disk, that unit's forward would find it gone: refused, naming both.
inline std::vector<placed_tensor> place(torch::nn::Module& model, const device_map& map, const std::string& caller) {
  const auto units = units_of(model);
  std::vector<placed_tensor> placed;
  std::map<const c10::TensorImpl*, std::size_t> seen;
  const auto add = [&](const std::string& name, const at::Tensor& tensor, bool parameter) {
    if (!tensor.defined()) return;
    const auto [first, inserted] = seen.emplace(tensor.unsafeGetTensorImpl(), placed.size());
    if (!inserted) {
      const auto& tied = placed[first->second];
      if (tied.device.type == map_device::kind::disk && innermost_unit(units, name) != tied.unit)
        throw device_map_error(caller + ": " + name + " is " + tied.name + " (tied), which is mapped to disk and " +
                               "brought in by another unit's forward than the one using " + name + "; map " +
                               tied.name + " to \"cpu\", or hold both names in one unit");
      return;
    }
    placed.push_back({.name = name,
                      .tensor = tensor,
                      .parameter = parameter,
                      .device = device_for(map, name, caller),
                      .unit = innermost_unit(units, name)});
  };
  for (const auto& item : model.named_parameters()) add(item.key(), item.value(), true);
  for (const auto& item : model.named_buffers()) add(item.key(), item.value(), false);
  return placed;
}

/// The LibTorch device of a map device that holds tensors in memory (a GPU needs CUDA: refused where it is missing).
inline c10::Device memory_device(const map_device& device, const std::string& caller) {
  if (device.type == map_device::kind::cpu) return c10::kCPU;
  if (device.type == map_device::kind::gpu) {
    if (!torch::cuda::is_available() || device.index >= static_cast<int>(torch::cuda::device_count()))
      throw device_map_error(
          caller + ": the device map places weights on GPU " + std::to_string(device.index) +
          ", which this machine does not have (CUDA: " + std::to_string(torch::cuda::device_count()) +
          " devices); map them to \"cpu\" or \"disk\"");
    return {c10::kCUDA, static_cast<c10::DeviceIndex>(device.index)};
  }
  throw std::logic_error("accel: disk holds no tensor in memory");
}

/// Throws unless `stored` holds `tensor` as the model has it (shape and dtype).
inline void check_stored(const stored_tensors& stored, const placed_tensor& item, const std::string& where) {
  const auto found = stored.find(item.name);
  if (found == stored.end())
    throw checkpoint_error("accel: " + where + " lacks " + item.name + "; nothing was dispatched");
  if (found->second.shape != item.tensor.sizes().vec() || found->second.type != item.tensor.scalar_type())
    throw checkpoint_error("accel: " + where + " holds " + item.name + " as " + c10::toString(found->second.type) +
                           c10::str(c10::IntArrayRef(found->second.shape)) + ", the model as " +
                           c10::toString(item.tensor.scalar_type()) + c10::str(item.tensor.sizes()) +
                           "; nothing was dispatched");
}

/// Where a dispatch reads each tensor from: `checkpoint` (load_checkpoint_and_dispatch: every tensor), and for the
/// tensors mapped to disk, `offload` (given, or written by `write_offloaded`).
struct weight_sources {
  const stored_tensors* checkpoint = nullptr;
  stored_tensors offload;
};

/// Refuses a dispatch that cannot be done, before anything of the model changes: a GPU this machine lacks, a tensor
/// on disk outside every unit (or resting on the CPU and running on a GPU outside every unit), a meta tensor with
/// nothing to load it from.
inline void check_placement(const std::vector<placed_tensor>& placed, const weight_sources& sources,
                            c10::Device execution, const std::string& caller) {
  for (const auto& item : placed) {
    if (item.device.type == map_device::kind::gpu) (void)memory_device(item.device, caller);  // a GPU that is there
    const bool disk = item.parameter && item.device.type == map_device::kind::disk;
    if (disk && !item.unit)
      throw device_map_error(
          caller + ": " + item.name +
          " is mapped to disk, but no accel::shard_unit holds it, and only a unit's forward can bring its weights in "
          "(LibTorch modules have no forward hooks); wrap the module that holds it in a unit "
          "(register_module(\"block\", accel::shard_unit(Block(...)))), or map it to \"cpu\"");
    if (item.parameter && item.device.type == map_device::kind::cpu && !execution.is_cpu() && !item.unit)
      throw device_map_error(caller + ": " + item.name + " rests on the CPU and runs on " + execution.str() +
                             ", but no accel::shard_unit holds it to move it there for its forward; wrap the module "
                             "that holds it in a unit, or map it to the GPU");
    if (sources.checkpoint == nullptr && item.tensor.is_meta() &&
        !((disk || !item.parameter) && sources.offload.count(item.name)))
      throw std::invalid_argument(caller + ": " + item.name +
                                  " is on the meta device (built under accel::init_empty_weights?): give its weights, "
                                  "with accel::load_checkpoint_and_dispatch or .offload_weights");
  }
}

/// Writes the disk-mapped tensors that have no file yet to `folder`/offload.safetensors and returns where they lie.
inline stored_tensors write_offloaded(const std::vector<placed_tensor>& placed, const weight_sources& sources,
                                      const std::filesystem::path& folder, const std::string& caller) {
  safetensors::tensor_list pending;
  for (const auto& item : placed)
    if (item.parameter && item.device.type == map_device::kind::disk && !sources.offload.count(item.name))
      pending.emplace_back(item.name, item.tensor);
  if (pending.empty()) return {};
  if (folder.empty())
    throw std::invalid_argument(caller + ": " + pending.front().first +
                                " is mapped to disk; give .offload_folder (where its weights are written) or "
                                ".offload_weights (a safetensors checkpoint that holds them)");
  std::filesystem::create_directories(folder);
  safetensors::save(folder / "offload.safetensors", pending);
  return locate_checkpoint(folder / "offload.safetensors");
}

/// Moves every tensor where the map places it and makes the units' hooks: a tensor in memory is loaded (from the
/// checkpoint) or moved to its device; one on disk lets its data go (meta) and is listed for its unit's forward, to
/// be read in on `execution`; with `execution` off the CPU, a unit's CPU tensors are moved there for its forward.
inline std::shared_ptr<offload_hooks> apply(const std::vector<placed_tensor>& placed, const weight_sources& sources,
                                            std::size_t units, c10::Device execution, const std::string& caller) {
  std::vector<std::vector<brought_in>> slots(units);
  tensor_reader reader;
  at::NoGradGuard no_grad;
  for (const auto& item : placed) {
    if (item.parameter && item.device.type == map_device::kind::disk) {
      const auto& stored =
          sources.offload.count(item.name) ? sources.offload.at(item.name) : sources.checkpoint->at(item.name);
      const auto meta = at::empty(item.tensor.sizes(), item.tensor.options().device(c10::kMeta));
      point_at(item.tensor, meta);
      slots[*item.unit].push_back({.tensor = item.tensor, .stored = stored, .at_rest = meta, .execution = execution});
      continue;
    }
    // Buffers of the CPU and disk entries stay in memory on the execution device (Accelerate's offload_buffers=False).
    const bool buffer_runs_there = !item.parameter && item.device.type != map_device::kind::gpu;
    const auto device = buffer_runs_there ? execution : memory_device(item.device, caller);
    auto data = sources.checkpoint != nullptr ? reader.read(sources.checkpoint->at(item.name))
                : item.tensor.is_meta()       ? reader.read(sources.offload.at(item.name))  // a buffer: check_placement
                                              : item.tensor;
    if (data.device() != device) data = data.to(device);
    if (!data.is_same(item.tensor)) point_at(item.tensor, data);
    // At rest it is a handle of its own on the CPU bytes: `data` may be the parameter itself, which the forward
    // points elsewhere.
    if (item.parameter && item.unit && device.is_cpu() && !execution.is_cpu())
      slots[*item.unit].push_back(
          {.tensor = item.tensor, .stored = {}, .at_rest = data.detach(), .execution = execution});
  }
  return std::make_shared<offload_hooks>(std::move(slots));
}

/// Accelerate's main device: the map's first GPU, else the CPU.
inline c10::Device main_device(const device_map& map, const std::optional<c10::Device>& given,
                               const std::string& caller) {
  if (given) return *given;
  std::optional<map_device> first;
  for (const auto& [name, device] : map)
    if (device.type == map_device::kind::gpu && (!first || device < *first)) first = device;
  return first ? memory_device(*first, caller) : c10::Device(c10::kCPU);
}

/// Throws unless `stored` holds exactly the model's tensors (every name of a tied one accepted), each with its shape
/// and dtype: checked before anything is read or changed.
inline void check_checkpoint(torch::nn::Module& model, const std::vector<placed_tensor>& placed,
                             const stored_tensors& stored, const std::string& where) {
  for (const auto& item : placed) check_stored(stored, item, where);
  std::set<std::string> names;
  for (const auto& item : model.named_parameters()) names.insert(item.key());
  for (const auto& item : model.named_buffers()) names.insert(item.key());
  for (const auto& [name, tensor] : stored)
    if (!names.count(name))
      throw checkpoint_error("accel: " + where + " holds " + name + ", which the model does not have (another " +
                             "model's checkpoint?); nothing was dispatched");
}
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
  init_empty_weights()
      : was_included_(c10::impl::tls_is_dispatch_key_included(detail::big_modeling::meta_key)),
        was_excluded_(c10::impl::tls_is_dispatch_key_excluded(detail::big_modeling::meta_key)) {
    detail::big_modeling::install_meta_factories();
    c10::impl::tls_set_dispatch_key_excluded(detail::big_modeling::meta_key, false);
    c10::impl::tls_set_dispatch_key_included(detail::big_modeling::meta_key, true);
  }
  init_empty_weights(const init_empty_weights&) = delete;
  init_empty_weights& operator=(const init_empty_weights&) = delete;
  ~init_empty_weights() {
    c10::impl::tls_set_dispatch_key_included(detail::big_modeling::meta_key, was_included_);
    c10::impl::tls_set_dispatch_key_excluded(detail::big_modeling::meta_key, was_excluded_);
  }

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
  /// (Accelerate's `offload_dir`). Not needed with `offload_weights`.
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
inline dispatched_model attached(torch::nn::Module& model, device_map map, std::shared_ptr<offload_hooks> hooks) {
  const auto units = units_of(model);
  for (std::size_t u = 0; u < units.size(); ++u) units[u].second->attach(hooks, u);
  return {std::move(map), std::move(hooks)};
}
}  // namespace detail::big_modeling

/// Places `model`'s parameters and buffers by `map` (Accelerate's `dispatch_model`): GPU entries are moved to their
/// GPU, CPU entries stay in memory, and disk entries are written to `options.offload_folder` (or found in
/// `options.offload_weights`) and let go: the `accel::shard_unit` holding them reads them in (ranged reads) for its
/// own forward, on the execution device, and lets them go after it. A disk entry must be inside a unit (or be one):
/// otherwise this throws naming it and the fix, before anything changes. On a GPU machine, CPU entries in a unit are
/// moved to the execution device for their forward as well; inputs are not moved (give each unit its inputs on its
/// device). Buffers stay in memory (on the execution device for CPU and disk entries).
inline dispatched_model dispatch_model(torch::nn::Module& model, device_map map, const dispatch_options& options = {}) {
  using namespace detail::big_modeling;
  const std::string caller = "accel::dispatch_model";
  const auto placed = place(model, map, caller);
  const auto execution = main_device(map, options.execution_device, caller);
  weight_sources sources;
  if (!options.offload_weights.empty()) {
    sources.offload = locate_checkpoint(options.offload_weights);
    for (const auto& item : placed)
      if ((item.parameter && item.device.type == map_device::kind::disk) ||
          (!item.parameter && item.tensor.is_meta() && sources.offload.count(item.name)))
        check_stored(sources.offload, item, options.offload_weights.string());
  }
  check_placement(placed, sources, execution, caller);
  sources.offload.merge(write_offloaded(placed, sources, options.offload_folder, caller));
  auto hooks = apply(placed, sources, units_of(model).size(), execution, caller);
  return attached(model, std::move(map), std::move(hooks));
}

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
inline dispatched_model load_checkpoint_and_dispatch(torch::nn::Module& model, const std::filesystem::path& checkpoint,
                                                     const checkpoint_dispatch_options& options) {
  using namespace detail::big_modeling;
  const std::string caller = "accel::load_checkpoint_and_dispatch";
  auto map = options.map.empty() ? infer_auto_device_map(describe_module(model), options.planning) : options.map;
  const auto placed = place(model, map, caller);
  const auto execution = main_device(map, options.execution_device, caller);
  const auto stored = locate_checkpoint(checkpoint);
  check_checkpoint(model, placed, stored, checkpoint.string());
  weight_sources sources{.checkpoint = &stored, .offload = {}};
  for (const auto& item : placed)
    if (item.parameter && item.device.type == map_device::kind::disk)
      sources.offload.emplace(item.name, stored.at(item.name));
  check_placement(placed, sources, execution, caller);
  auto hooks = apply(placed, sources, units_of(model).size(), execution, caller);
  return attached(model, std::move(map), std::move(hooks));
}

/// Keeps every weight in CPU memory and runs each unit on `execution_device` (Accelerate's `cpu_offload`): on a GPU,
/// each unit's weights are moved there for its forward and let go after it, so that the GPU holds one unit's weights
/// at a time (every parameter must then be in a unit). On the CPU the weights simply stay where they are.
inline dispatched_model cpu_offload(torch::nn::Module& model, c10::Device execution_device = c10::kCPU) {
  return dispatch_model(model, {{"", map_device::cpu()}}, {.execution_device = execution_device});
}

/// Writes every weight to `offload_dir`/offload.safetensors, lets it go, and reads each unit's back for its forward
/// only, on `execution_device` (Accelerate's `disk_offload`). Every parameter must be in a unit (`accel::shard_unit`);
/// buffers stay in memory.
inline dispatched_model disk_offload(torch::nn::Module& model, const std::filesystem::path& offload_dir,
                                     c10::Device execution_device = c10::kCPU) {
  return dispatch_model(model, {{"", map_device::disk()}},
                        {.offload_folder = offload_dir, .execution_device = execution_device});
}

}  // namespace accel
