/// \file
/// What device_map.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../device_map.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <fstream>

namespace accel {

std::string map_device::str() const {
  return type == kind::gpu ? std::to_string(index) : type == kind::cpu ? "cpu" : "disk";
}

std::int64_t module_sizes::of(const std::string& name) const {
  const auto found = index_.find(name);
  return found == index_.end() ? 0 : entries_[found->second].second;
}

void module_sizes::add_tensor(const std::string& full_name, std::int64_t bytes) {
  std::string prefix;
  for (std::size_t start = 0;;) {
    const auto [found, inserted] = index_.emplace(prefix, entries_.size());
    if (inserted) entries_.emplace_back(prefix, 0);
    entries_[found->second].second += bytes;
    if (prefix == full_name) break;
    const auto dot = full_name.find('.', start);
    prefix = full_name.substr(0, dot);
    start = dot == std::string::npos ? full_name.size() : dot + 1;
  }
}
}  // namespace accel

namespace accel::detail::device_planning {

std::int64_t tensor_bytes(const module_tensor& tensor, std::optional<std::int64_t> dtype_size) {
  if (tensor.elements < 0 || tensor.element_size <= 0)
    throw device_map_error("accel: device map: tensor " + tensor.name + " has " + std::to_string(tensor.elements) +
                           " elements of " + std::to_string(tensor.element_size) +
                           " bytes; give a count >= 0 and an element size > 0");
  const bool converted = dtype_size && tensor.floating_point;
  return tensor.elements * (converted ? std::min(*dtype_size, tensor.element_size) : tensor.element_size);
}

model_sizes measure(const module_tree& root, std::optional<std::int64_t> dtype_size) {
  model_sizes sizes;
  std::map<std::string, std::vector<std::string>> ties;  // first name -> the later names of the same tensor
  visit_modules(root, "", [&](const module_tree& module, const std::string& name) {
    sizes.modules[name] = &module;
    for (const auto& p : module.parameters) {
      const auto full = joined(name, p.name);
      if (p.tied_to.empty()) {
        sizes.add_tensor(full, tensor_bytes(p, dtype_size));
      } else {
        ties[p.tied_to].push_back(full);
      }
    }
  });
  visit_modules(root, "", [&](const module_tree& module, const std::string& name) {
    for (const auto& b : module.buffers)  // a buffer met before (a shared table) counts once, and ties nothing
      if (b.tied_to.empty()) sizes.add_tensor(joined(name, b.name), tensor_bytes(b, dtype_size));
  });
  for (auto& [first, others] : ties) {
    if (!sizes.contains(first))
      throw device_map_error("accel: device map: parameter " + others.front() + " is tied to " + first +
                             ", which the model does not have before it; name the first parameter of the tie");
    others.push_back(first);
    std::sort(others.begin(), others.end());
    others.erase(std::unique(others.begin(), others.end()), others.end());
    sizes.tied_groups.push_back(others);
  }
  return sizes;
}

std::vector<item> children_of(const module_tree& module, const std::string& full_name) {
  std::vector<item> children;
  std::vector<std::string> instances;  // each child's first registration: the instance it is
  for (const auto& c : module.children) {
    auto name = joined(full_name, c.name);
    auto instance = c.shared_with.empty() ? name : c.shared_with;
    if (contains(instances, instance)) continue;
    instances.push_back(std::move(instance));
    children.push_back({std::move(name), &c});
  }
  return children;
}

std::vector<item> split_items(const item& split) {
  std::vector<item> parts;
  for (const auto& p : split.module->parameters) parts.push_back({joined(split.name, p.name), nullptr});
  const auto children = children_of(*split.module, split.name);
  parts.insert(parts.end(), children.begin(), children.end());
  return parts;
}

std::vector<item> top_level_items(const module_tree& model) {
  auto items = split_items({"", &model});
  for (const auto& b : model.buffers) items.push_back({b.name, nullptr});
  return items;
}

bool splittable(const item& entry, const std::vector<std::string>& no_split) {
  return entry.module != nullptr && !entry.module->children.empty() && !contains(no_split, entry.module->class_name);
}

layer_size largest_layer(std::vector<item> items, const module_sizes& sizes, const std::vector<std::string>& no_split) {
  layer_size largest;
  while (!items.empty()) {
    const item entry = items.front();
    items.erase(items.begin());
    if (entry.module == nullptr || entry.module->children.empty() || contains(no_split, entry.module->class_name)) {
      const auto size = sizes.of(entry.name);
      if (size > largest.bytes) largest.names.clear();
      if (size >= largest.bytes) largest.names.push_back(entry.name);
      largest.bytes = std::max(largest.bytes, size);
      continue;
    }
    const auto children = children_of(*entry.module, entry.name);
    items.insert(items.begin(), children.begin(), children.end());
  }
  return largest;
}

std::vector<item> modules_only(const std::vector<item>& items) {
  std::vector<item> modules;
  std::copy_if(items.begin(), items.end(), std::back_inserter(modules), [](const item& i) { return i.module; });
  return modules;
}

std::vector<std::string> outside_ties(const std::string& name, const model_sizes& sizes) {
  std::vector<std::string> outside;
  for (const auto& group : sizes.tied_groups) {
    const bool any_in = std::any_of(group.begin(), group.end(), [&](const auto& p) { return inside(p, name); });
    const bool all_in = std::all_of(group.begin(), group.end(), [&](const auto& p) { return inside(p, name); });
    if (!any_in || all_in) continue;
    for (const auto& p : group)
      if (!inside(p, name)) outside.push_back(p);
  }
  return outside;
}

tied_size size_with_ties(const std::string& name, const std::vector<std::string>& tied, const model_sizes& sizes,
                         const std::vector<item>& pending) {
  tied_size result{sizes.of(name), {}};
  for (const auto& param : tied) {
    const auto holder =
        std::find_if(pending.begin(), pending.end(), [&](const item& i) { return param.rfind(i.name + ".", 0) == 0; });
    if (holder == pending.end()) continue;  // its holder is placed already (with a tie of its own)
    result.holders.push_back(*holder);
    result.bytes += sizes.of(holder->name) - sizes.of(param);
  }
  return result;
}

std::int64_t balance_margin(const model_sizes& sizes, const std::vector<std::string>& no_split) {
  std::map<std::string, std::int64_t> first_of_class;
  std::vector<std::string> order;
  for (const auto& entry : sizes.entries()) order.push_back(entry.first);
  for (const auto& name : order) {
    const auto module = sizes.modules.find(name);
    if (name.empty() || module == sizes.modules.end()) continue;
    const auto& class_name = module->second->class_name;
    if (contains(no_split, class_name)) first_of_class.try_emplace(class_name, sizes.of(name));
  }
  std::int64_t margin = 0;
  for (const auto& entry : first_of_class) margin = std::max(margin, entry.second);
  // Accelerate's get_module_leaves twice: first the tensors go, then the names left without children are averaged.
  auto leaves_of = [](const std::vector<std::string>& names) {
    std::unordered_map<std::string, int> children;
    for (const auto& n : names)
      if (!n.empty() && n.find('.') != std::string::npos) ++children[n.substr(0, n.rfind('.'))];
    std::vector<std::string> leaves;
    for (const auto& n : names)
      if (!n.empty() && !children.contains(n)) leaves.push_back(n);
    return leaves;
  };
  const auto tensors = leaves_of(order);
  std::vector<std::string> modules;
  std::copy_if(order.begin(), order.end(), std::back_inserter(modules),
               [&](const std::string& n) { return !contains(tensors, n); });
  const auto innermost = leaves_of(modules);
  std::int64_t sum = 0;
  for (const auto& n : innermost) sum += sizes.of(n);
  const auto mean = sum / std::max<std::int64_t>(static_cast<std::int64_t>(innermost.size()), 1);
  const auto larger = std::max(margin, mean);
  return larger + larger / 4;
}

void check_limits(const memory_limits& limits) {
  for (const auto& [device, bytes] : limits) {
    if (device.type == map_device::kind::gpu && device.index < 0)
      throw device_map_error("accel: device map: GPU " + device.str() + " in max_memory; GPU indices start at 0");
    if (bytes < 0)
      throw device_map_error("accel: device map: max_memory of " + device.str() + " is " + std::to_string(bytes) +
                             " bytes; give 0 or more (0: the device holds nothing)");
  }
}

void check_no_split_classes(const module_tree& model, const std::vector<std::string>& no_split) {
  std::vector<std::string> classes;
  visit_modules(model, "", [&](const module_tree& module, const std::string&) {
    if (!contains(classes, module.class_name)) classes.push_back(module.class_name);
  });
  for (const auto& name : no_split) {
    if (contains(classes, name)) continue;
    std::string known;
    for (const auto& c : classes) known += (known.empty() ? "" : ", ") + c;
    throw device_map_error("accel: device map: no_split_module_classes names \"" + name +
                           "\", the class of no module of the model, so it would split nothing apart; its classes "
                           "are " +
                           known +
                           " (a module's Module::name(); an accel::shard_unit's is its wrapped "
                           "module's)");
  }
}

std::int64_t available_cpu_memory() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.starts_with("MemAvailable:")) return std::stoll(line.substr(13)) * 1024;  // "MemAvailable: N kB"
  return static_cast<std::int64_t>(::sysconf(_SC_AVPHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
}

std::vector<std::int64_t> free_cuda_memory() {
  using count_function = int (*)(int*);
  using set_function = int (*)(int);
  using info_function = int (*)(std::size_t*, std::size_t*);
  const auto device_count = reinterpret_cast<count_function>(::dlsym(RTLD_DEFAULT, "cudaGetDeviceCount"));
  const auto get_device = reinterpret_cast<count_function>(::dlsym(RTLD_DEFAULT, "cudaGetDevice"));
  const auto set_device = reinterpret_cast<set_function>(::dlsym(RTLD_DEFAULT, "cudaSetDevice"));
  const auto memory_info = reinterpret_cast<info_function>(::dlsym(RTLD_DEFAULT, "cudaMemGetInfo"));
  std::vector<std::int64_t> free;
  int count = 0, current = 0;
  if (!device_count || !get_device || !set_device || !memory_info || device_count(&count) != 0 ||
      get_device(&current) != 0)
    return free;
  for (int i = 0; i < count; ++i) {
    std::size_t bytes = 0, total = 0;
    if (set_device(i) != 0 || memory_info(&bytes, &total) != 0) break;  // a device that fails ends the list
    free.push_back(static_cast<std::int64_t>(bytes));
  }
  set_device(current);
  return free;
}

void clean(device_map& map, const std::string& module_name) {
  const std::string prefix = module_name.empty() ? "" : module_name + ".";
  auto under = [&](const std::string& key) { return key.rfind(prefix, 0) == 0 && key.size() > module_name.size(); };
  std::vector<std::size_t> members;
  for (std::size_t i = 0; i < map.size(); ++i)
    if (map[i].first.rfind(prefix, 0) == 0) members.push_back(i);
  const bool one_device = std::all_of(members.begin(), members.end(),
                                      [&](std::size_t i) { return map[i].second == map[members[0]].second; });
  if (members.size() > 1 && one_device) {
    const auto grouped = std::make_pair(module_name, map[members[0]].second);
    for (auto i = members.rbegin(); i != members.rend(); ++i) map.erase(map.begin() + static_cast<std::ptrdiff_t>(*i));
    map.insert(map.begin() + static_cast<std::ptrdiff_t>(members[0]), grouped);
  }
  std::vector<std::string> children;
  for (const auto& [key, device] : map) {
    if (!under(key)) continue;
    const auto end = key.find('.', prefix.size());
    const auto child = key.substr(0, end);
    if (!contains(children, child)) children.push_back(child);
  }
  for (const auto& child : children) clean(map, child);
}

planner::planner(const module_tree& model, const memory_limits& limits, const device_map_options& options)
    : sizes_(measure(model, options.dtype_size)),
      no_split_(options.no_split_module_classes),
      limits_(limits),
      to_disk_(options.offload_to_disk) {
  for (const auto& entry : limits)
    if (entry.first.type != map_device::kind::disk) devices_.push_back(entry.first);
  devices_.push_back(map_device::disk());
  pending_ = top_level_items(model);
  largest_ = largest_layer(pending_, sizes_, no_split_);
}

device_map planner::plan() {
  while (!pending_.empty()) step();
  return std::move(map_);
}

bool planner::keeps_room(const map_device& device) const {
  if (device.type == map_device::kind::cpu) return true;
  return device.type == map_device::kind::gpu && device == devices_.front();
}

void planner::step() {
  const item entry = pending_.front();
  pending_.erase(pending_.begin());
  std::erase_if(largest_.names,
                [&](const std::string& n) { return n == entry.name || n.rfind(entry.name + ".", 0) == 0; });
  if (largest_.names.empty()) refresh_largest();
  const auto tied = outside_ties(entry.name, sizes_);
  const map_device device = devices_[current_];
  std::optional<std::int64_t> limit;
  std::int64_t reserved = 0;
  if (device.type != map_device::kind::disk) limit = limits_.at(device);
  if (keeps_room(device)) {
    *limit -= largest_.bytes;
    reserved = largest_.bytes;
  }
  const auto with_ties = size_with_ties(entry.name, tied, sizes_, pending_);
  if (!limit || used_[device] + with_ties.bytes <= *limit) return place(entry, with_ties, device);
  const auto size = sizes_.of(entry.name);
  if (!tied.empty() && used_[device] + size <= *limit && split_a_tie(entry, with_ties)) return;
  if (used_[device] + size >= *limit && splittable(entry, no_split_)) {
    const auto parts = split_items(entry);
    pending_.insert(pending_.begin(), parts.begin(), parts.end());
    return refresh_largest();
  }
  used_[device] += reserved;
  ++current_;
  pending_.insert(pending_.begin(), entry);
}

void planner::place(const item& entry, const tied_size& with_ties, const map_device& device) {
  if (device.type == map_device::kind::disk && !to_disk_) refuse(entry);
  used_[device] += with_ties.bytes;
  map_.emplace_back(entry.name, device);
  for (const auto& holder : with_ties.holders) {
    std::erase_if(pending_, [&](const item& i) { return i.name == holder.name; });
    map_.emplace_back(holder.name, device);
  }
}

bool planner::split_a_tie(const item& entry, const tied_size& with_ties) {
  for (const auto& holder : with_ties.holders) {
    if (!splittable(holder, no_split_)) continue;
    const auto at =
        std::find_if(pending_.begin(), pending_.end(), [&](const item& i) { return i.name == holder.name; });
    const auto parts = split_items(holder);
    pending_.insert(pending_.erase(at), parts.begin(), parts.end());
    pending_.insert(pending_.begin(), entry);
    refresh_largest();
    return true;
  }
  return false;
}

void planner::refresh_largest() { largest_ = largest_layer(modules_only(pending_), sizes_, no_split_); }

void planner::refuse(const item& entry) const {
  const std::string what =
      entry.module == nullptr ? "tensor " + entry.name : "module " + entry.name + " (" + entry.module->class_name + ")";
  const bool no_split = entry.module != nullptr && contains(no_split_, entry.module->class_name);
  const auto size = std::to_string(sizes_.of(entry.name));
  const auto with_room = std::to_string(sizes_.of(entry.name) + largest_.bytes);
  throw device_map_error(
      "accel: device map: " + what + " of " + size +
      " bytes fits on no device left in max_memory and offload_to_disk is false (GPU 0 and the "
      "CPU keep room for the largest layer left, " +
      std::to_string(largest_.bytes) + " bytes, beside what they hold); raise max_memory so that a device has " + size +
      " bytes free (GPU 0 or the CPU: " + with_room + ")" +
      (no_split ? ", take " + entry.module->class_name + " out of no_split_module_classes so that it can be split"
                : "") +
      ", or set offload_to_disk");
}
}  // namespace accel::detail::device_planning

namespace accel {

module_sizes compute_module_sizes_function::operator()(const module_tree& model,
                                                       std::optional<std::int64_t> dtype_size) const {
  return detail::device_planning::measure(model, dtype_size);
}

layer_size get_max_layer_size_function::operator()(const module_tree& model, const module_sizes& sizes,
                                                   const std::vector<std::string>& no_split_module_classes) const {
  namespace planning = detail::device_planning;
  return planning::largest_layer(planning::top_level_items(model), sizes, no_split_module_classes);
}

memory_limits get_max_memory() {
  namespace planning = detail::device_planning;
  memory_limits limits;
  const auto gpus = planning::free_cuda_memory();
  for (std::size_t i = 0; i < gpus.size(); ++i) limits[map_device::gpu(static_cast<int>(i))] = gpus[i];
  limits[map_device::cpu()] = planning::available_cpu_memory();
  return limits;
}

namespace detail::device_planning {

void keep_gpu0_low(memory_limits& limits, std::size_t gpus, std::int64_t total) {
  std::int64_t others = 0;
  for (int i = 1; i < static_cast<int>(gpus); ++i) {
    const auto found = limits.find(map_device::gpu(i));
    if (found == limits.end())
      throw device_map_error("accel: device map: balanced_low_0 counts GPUs 1 to " + std::to_string(gpus - 1) +
                             " (as Accelerate), but max_memory has no GPU " + std::to_string(i) +
                             "; number the GPUs from 0 without gaps");
    others += found->second;
  }
  auto& zero = limits.at(map_device::gpu(0));
  zero = std::min(std::max<std::int64_t>(0, total - others), zero);
}
}  // namespace detail::device_planning

memory_limits get_balanced_memory_function::operator()(const module_tree& model, memory_limits max_memory,
                                                       const std::vector<std::string>& no_split_module_classes,
                                                       bool low_zero, std::optional<std::int64_t> dtype_size) const {
  namespace planning = detail::device_planning;
  const bool measured = max_memory.empty();
  if (measured) max_memory = get_max_memory();
  planning::check_limits(max_memory);
  planning::check_no_split_classes(model, no_split_module_classes);
  std::vector<int> gpus;  // those with memory, by index
  for (const auto& [device, bytes] : max_memory)
    if (device.type == map_device::kind::gpu && bytes > 0) gpus.push_back(device.index);
  if (gpus.size() == 1 && measured) {  // Accelerate keeps 10% of a single GPU it measured for buffers
    auto& only = max_memory.begin()->second;
    only = static_cast<std::int64_t>(static_cast<double>(only) * 0.9);
  }
  if (gpus.size() <= 1) return max_memory;
  if (low_zero && !max_memory.contains(map_device::gpu(0)))
    throw device_map_error(
        "accel: device map: balanced_low_0 keeps GPU 0 low, but max_memory has no GPU 0; give GPU 0 a limit (0 "
        "keeps it empty), or use balanced");
  const auto sizes = planning::measure(model, dtype_size);
  const auto share_of = static_cast<std::int64_t>(gpus.size()) - (low_zero ? 1 : 0);
  const auto per_gpu = sizes.total() / share_of + planning::balance_margin(sizes, no_split_module_classes);
  for (std::size_t i = 0; i + 1 < gpus.size(); ++i) {
    auto& limit = max_memory[map_device::gpu(gpus[i])];
    limit = std::min(low_zero && gpus[i] == 0 ? limit : per_gpu, limit);
  }
  if (low_zero) planning::keep_gpu0_low(max_memory, gpus.size(), sizes.total());
  return max_memory;
}

device_map infer_auto_device_map_function::operator()(const module_tree& model,
                                                      const device_map_options& options) const {
  namespace planning = detail::device_planning;
  planning::check_limits(options.max_memory);
  planning::check_no_split_classes(model, options.no_split_module_classes);
  auto limits = options.max_memory;
  if (options.strategy != device_map_strategy::sequential)
    limits = get_balanced_memory(model, limits, options.no_split_module_classes,
                                 options.strategy == device_map_strategy::balanced_low_0, options.dtype_size);
  else if (limits.empty())
    limits = get_max_memory();
  auto map = planning::planner(model, limits, options).plan();
  if (options.clean_result) planning::clean(map, "");
  return map;
}

}  // namespace accel
