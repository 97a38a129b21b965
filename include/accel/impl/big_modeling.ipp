/// \file
/// What big_modeling.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../big_modeling.hpp"

#include <sys/file.h>

namespace accel::detail::big_modeling {

bool mentions_tensor(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  const auto contained = type->containedTypes();
  return std::any_of(contained.begin(), contained.end(), [](const c10::TypePtr& t) { return mentions_tensor(t); });
}

void made_on_meta(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
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

void install_meta_factories() {
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

void add_stored(stored_tensors& out, const std::filesystem::path& file) {
  const auto header = safetensors::detail::read_header(file);
  const auto size = std::filesystem::file_size(file);
  safetensors::detail::check_ranges(header.entries, size - header.data_begin, file.string());
  for (const auto& [name, entry] : header.entries) {
    const auto type = safetensors::detail::scalar_type_of(entry.dtype);
    if (!type)
      throw checkpoint_error("accel: " + file.string() + ": " + name + " has the unknown dtype " + entry.dtype);
    std::int64_t bytes = 0;
    if (__builtin_mul_overflow(safetensors::detail::element_count(entry.shape, name, file.string()),
                               static_cast<std::int64_t>(c10::elementSize(*type)), &bytes) ||
        entry.offsets.size() != 2 || entry.offsets[1] - entry.offsets[0] != bytes ||
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

stored_tensors locate_checkpoint(const std::filesystem::path& where) {
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

at::Tensor tensor_reader::read(const stored_tensor& stored) {
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

int tensor_reader::descriptor(const std::filesystem::path& file) {
  const auto found = files_.find(file);
  if (found != files_.end()) return found->second;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw checkpoint_error("accel: cannot open " + file.string() + " for reading (missing file?)");
  (void)::flock(fd, LOCK_SH | LOCK_NB);  // fails only while a dispatch checks the file: it then sees no reader
  return files_.emplace(file, fd).first->second;
}

offload_hooks::offload_hooks(std::vector<std::vector<brought_in>> units) : units_(std::move(units)) {
  for (const auto& unit : units_)
    for (const auto& slot : unit)
      if (slot.stored) reader_.keep_open(slot.stored->file);
}

void offload_hooks::before_unit_forward(std::size_t unit) {
  for (const auto& slot : units_.at(unit)) {
    auto data = slot.stored ? reader_.read(*slot.stored) : slot.at_rest;
    point_at(slot.tensor, data.device() == slot.execution ? data : data.to(slot.execution));
  }
}

bool is_under(const std::string& name, const std::string& prefix) {
  return prefix.empty() || name == prefix || (name.starts_with(prefix) && name[prefix.size()] == '.');
}

std::vector<std::pair<std::string, shard_unit_base*>> units_of(torch::nn::Module& model) {
  std::vector<std::pair<std::string, shard_unit_base*>> units;
  if (auto* root = dynamic_cast<shard_unit_base*>(&model)) units.emplace_back("", root);
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (auto* unit = dynamic_cast<shard_unit_base*>(item.value().get())) units.emplace_back(item.key(), unit);
  return units;
}

map_device device_for(const device_map& map, const std::string& name, const std::string& caller) {
  const std::pair<std::string, map_device>* best = nullptr;
  for (const auto& entry : map)
    if (is_under(name, entry.first) && (best == nullptr || entry.first.size() > best->first.size())) best = &entry;
  if (best == nullptr)
    throw device_map_error(caller + ": the device map places nothing of " + name +
                           "; map it, or a module holding it (\"\" maps the whole model)");
  return best->second;
}

std::optional<std::size_t> innermost_unit(const std::vector<std::pair<std::string, shard_unit_base*>>& units,
                                          const std::string& name) {
  std::optional<std::size_t> found;
  for (std::size_t u = 0; u < units.size(); ++u)
    if (is_under(name, units[u].first) && (!found || units[u].first.size() >= units[*found].first.size())) found = u;
  return found;
}

void check_map_keys(const torch::nn::Module& model, const device_map& map, const std::string& caller) {
  std::set<std::string> names{""};
  for (const auto& item : model.named_modules("", /*include_self=*/false)) names.insert(item.key());
  for (const auto& item : model.named_parameters()) names.insert(item.key());
  for (const auto& item : model.named_buffers()) names.insert(item.key());
  for (const auto& [key, device] : map) {
    if (names.count(key)) continue;
    std::string top;
    for (const auto& child : model.named_children()) top += (top.empty() ? "" : ", ") + child.key();
    throw device_map_error(caller + ": the device map's key \"" + key +
                           "\" names no module, parameter or buffer of the model (a typo?); fix or remove it "
                           "(its top-level modules are " +
                           (top.empty() ? "none" : top) + ")");
  }
}

std::vector<placed_tensor> place(torch::nn::Module& model, const device_map& map, const std::string& caller) {
  check_map_keys(model, map, caller);
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

c10::Device memory_device(const map_device& device, const std::string& caller) {
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

void check_stored(const stored_tensors& stored, const placed_tensor& item, const std::string& where) {
  const auto found = stored.find(item.name);
  if (found == stored.end())
    throw checkpoint_error("accel: " + where + " lacks " + item.name + "; nothing was dispatched");
  if (found->second.shape != item.tensor.sizes().vec() || found->second.type != item.tensor.scalar_type())
    throw checkpoint_error("accel: " + where + " holds " + item.name + " as " + c10::toString(found->second.type) +
                           c10::str(c10::IntArrayRef(found->second.shape)) + ", the model as " +
                           c10::toString(item.tensor.scalar_type()) + c10::str(item.tensor.sizes()) +
                           "; nothing was dispatched");
}

void check_placement(const std::vector<placed_tensor>& placed, const weight_sources& sources, c10::Device execution,
                     const std::string& caller) {
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

void check_not_in_use(const std::filesystem::path& file, const std::string& caller) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // no file yet
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  if (!free)
    throw std::invalid_argument(caller + ": " + file.string() +
                                " holds the disk weights of another dispatched model that is still alive (in this "
                                "process or another), which would compute with this one's instead; give each model "
                                "an offload folder of its own, or let the other's accel::dispatched_model go first");
}

stored_tensors write_offloaded(const std::vector<placed_tensor>& placed, const weight_sources& sources,
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
  check_not_in_use(folder / "offload.safetensors", caller);
  safetensors::save(folder / "offload.safetensors", pending);
  return locate_checkpoint(folder / "offload.safetensors");
}

std::shared_ptr<offload_hooks> apply(const std::vector<placed_tensor>& placed, const weight_sources& sources,
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

c10::Device main_device(const device_map& map, const std::optional<c10::Device>& given, const std::string& caller) {
  if (given) return *given;
  std::optional<map_device> first;
  for (const auto& [name, device] : map)
    if (device.type == map_device::kind::gpu && (!first || device < *first)) first = device;
  return first ? memory_device(*first, caller) : c10::Device(c10::kCPU);
}

void check_checkpoint(torch::nn::Module& model, const std::vector<placed_tensor>& placed, const stored_tensors& stored,
                      const std::string& where) {
  for (const auto& item : placed) check_stored(stored, item, where);
  std::set<std::string> names;
  for (const auto& item : model.named_parameters()) names.insert(item.key());
  for (const auto& item : model.named_buffers()) names.insert(item.key());
  for (const auto& [name, tensor] : stored)
    if (!names.count(name))
      throw checkpoint_error("accel: " + where + " holds " + name + ", which the model does not have (another " +
                             "model's checkpoint?); nothing was dispatched");
}
}  // namespace accel::detail::big_modeling

namespace accel {

init_empty_weights::init_empty_weights()
    : was_included_(c10::impl::tls_is_dispatch_key_included(detail::big_modeling::meta_key)),
      was_excluded_(c10::impl::tls_is_dispatch_key_excluded(detail::big_modeling::meta_key)) {
  detail::big_modeling::install_meta_factories();
  c10::impl::tls_set_dispatch_key_excluded(detail::big_modeling::meta_key, false);
  c10::impl::tls_set_dispatch_key_included(detail::big_modeling::meta_key, true);
}

init_empty_weights::~init_empty_weights() {
  c10::impl::tls_set_dispatch_key_included(detail::big_modeling::meta_key, was_included_);
  c10::impl::tls_set_dispatch_key_excluded(detail::big_modeling::meta_key, was_excluded_);
}
}  // namespace accel

namespace accel::detail::big_modeling {

dispatched_model attached(torch::nn::Module& model, device_map map, std::shared_ptr<offload_hooks> hooks) {
  const auto units = units_of(model);
  for (std::size_t u = 0; u < units.size(); ++u) units[u].second->attach(hooks, u);
  return {std::move(map), std::move(hooks)};
}
}  // namespace accel::detail::big_modeling

namespace accel {

dispatched_model dispatch_model_function::operator()(torch::nn::Module& model, device_map map,
                                                     const dispatch_options& options) const {
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

dispatched_model load_checkpoint_and_dispatch_function::operator()(torch::nn::Module& model,
                                                                   const std::filesystem::path& checkpoint,
                                                                   const checkpoint_dispatch_options& options) const {
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

dispatched_model cpu_offload_function::operator()(torch::nn::Module& model, c10::Device execution_device) const {
  return dispatch_model(model, {{"", map_device::cpu()}}, {.execution_device = execution_device});
}

dispatched_model disk_offload_function::operator()(torch::nn::Module& model, const std::filesystem::path& offload_dir,
                                                   c10::Device execution_device) const {
  return dispatch_model(model, {{"", map_device::disk()}},
                        {.offload_folder = offload_dir, .execution_device = execution_device});
}

}  // namespace accel
