/// \file
/// `accel::infer_auto_device_map`: where each part of a model goes (GPUs in order, then the CPU, then disk) under
/// per-device memory limits, with the rules of Accelerate's `infer_auto_device_map` and `get_balanced_memory`
/// (accelerate/utils/modeling.py, 1.15): modules placed whole in order, one that does not fit split into its direct
/// parameters and children unless its class is no-split, tied parameters kept on one device, room kept on GPU 0 and
/// the CPU for the largest layer (offloaded layers come back there for their forward). It plans over a plain
/// description of the module tree, so it needs no LibTorch; accel/device_map_torch.hpp describes a torch::nn::Module.
/// `bigmodel.device_map.*` compares its maps with Accelerate's own on the same torch.nn models.
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "detail/config.hpp"

namespace accel {

/// A parameter or buffer of a module: its name in that module, its size, and, for a tensor that is the same tensor
/// as one met before it, the full name of that first one (its bytes count there, once, as Accelerate's
/// `named_parameters` and `named_buffers` list it once). A parameter met before is a tied weight, kept on one device
/// with its first name; a buffer met before (a rotary table registered in every layer) is only not counted again.
/// Element sizes are the real ones: a bool tensor's 1 byte, where Accelerate counts 1/8 (docs/big-models.md).
struct module_tensor {
  std::string name{};
  std::int64_t elements = 0;
  std::int64_t element_size = 4;
  bool floating_point = true;  ///< integer and bool tensors keep their size when a dtype is given, as Accelerate's
  std::string tied_to{};       ///< empty: met first here; else the full name of the tensor it is
};

/// One module: its name in its parent ("" for the root), its class name (what `no_split_module_classes` names), its
/// own parameters and buffers, and its children in registration order. A module instance registered under several
/// names (a layer shared ALBERT-style) is described under each, with `shared_with` naming its first registration:
/// its tensors count there (they are tied to their first names), and a parent lists it once among its children, as
/// Accelerate's `named_children` does.
struct module_tree {
  std::string name{};
  std::string class_name{};
  std::vector<module_tensor> parameters{};
  std::vector<module_tensor> buffers{};
  std::vector<module_tree> children{};
  std::string shared_with{};  ///< empty: met first here; else the full name of the module instance's first registration
};

/// The bytes of every module and tensor of a model by full name ("" for the whole model), in the order Accelerate's
/// `compute_module_sizes` meets them (the parameters in module order, then the buffers; a tensor met before counts
/// once, at its first name): what `infer_auto_device_map` and `get_balanced_memory` plan with.
class module_sizes {
 public:
  /// The bytes of `name`, a module or tensor; 0 for a name that holds nothing counted (Accelerate's defaultdict).
  [[nodiscard]] ACCEL_DECL std::int64_t of(const std::string& name) const;
  [[nodiscard]] std::int64_t total() const { return of(""); }
  [[nodiscard]] bool contains(const std::string& name) const { return index_.contains(name); }
  /// (name, bytes) in Accelerate's order.
  [[nodiscard]] const std::vector<std::pair<std::string, std::int64_t>>& entries() const noexcept { return entries_; }
  /// Adds `bytes` to the tensor `full_name` and to every module holding it ("a.b.c": "", "a", "a.b", "a.b.c").
  ACCEL_DECL void add_tensor(const std::string& full_name, std::int64_t bytes);

 private:
  std::vector<std::pair<std::string, std::int64_t>> entries_{};
  std::unordered_map<std::string, std::size_t> index_{};
};

/// The largest layer of a model and the names of those of its size (a layer: a module without children, one of a
/// no-split class, or a tensor), as Accelerate's `get_max_layer_size` finds it.
struct layer_size {
  std::int64_t bytes = 0;
  std::vector<std::string> names{};
};

/// A device of a device map: GPU `index`, the CPU or disk. Ordered as Accelerate fills them: GPUs by index, CPU, disk.
struct map_device {
  enum class kind { gpu, cpu, disk };
  kind type = kind::cpu;
  int index = 0;

  static map_device gpu(int i) { return {kind::gpu, i}; }
  static map_device cpu() { return {kind::cpu, 0}; }
  static map_device disk() { return {kind::disk, 0}; }
  /// As Accelerate writes it in a device map: "0", "1", ..., "cpu", "disk".
  [[nodiscard]] ACCEL_DECL std::string str() const;
  auto operator<=>(const map_device&) const = default;
};

/// Writes `device.str()` (so that a device map prints as Accelerate's does).
inline std::ostream& operator<<(std::ostream& out, const map_device& device) { return out << device.str(); }

/// Bytes each device may hold (Accelerate's `max_memory`). Disk is always available, without a limit.
using memory_limits = std::map<map_device, std::int64_t>;

/// Accelerate's `device_map` strings: `sequential` fills GPU 0 before GPU 1 (what `infer_auto_device_map` alone does);
/// `balanced` first lowers each GPU's limit but the last to an even share (`get_balanced_memory`); `balanced_low_0`
/// also keeps GPU 0 as empty as the others allow; `automatic` is Accelerate's "auto", which is `balanced`.
enum class device_map_strategy { sequential, balanced, balanced_low_0, automatic };

struct device_map_options {
  memory_limits max_memory{};                          ///< empty: what the machine has free (`get_max_memory`)
  std::vector<std::string> no_split_module_classes{};  ///< modules of these classes are placed whole
  device_map_strategy strategy = device_map_strategy::sequential;
  std::optional<std::int64_t> dtype_size{};  ///< bytes per element of the dtype loaded into (Accelerate's `dtype`)
  bool offload_to_disk = true;               ///< false: refuse a plan that needs disk instead of mapping to it
  bool clean_result = true;                  ///< group submodules on one device under their parent, as Accelerate's
};

/// Module or tensor names (as `named_modules` / `named_parameters` give them, "" for the whole model) to devices, in
/// the order they were placed.
using device_map = std::vector<std::pair<std::string, map_device>>;

/// A plan that cannot be made: the message names the module and the fix.
class device_map_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail::device_planning {

/// An entry of the list still to place: a module, or one of a module's own tensors (`module` null).
struct item {
  std::string name;
  const module_tree* module = nullptr;
};

inline std::string joined(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

inline bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

/// The model's sizes, each module by its full name, and the groups of tied parameters (each group's names sorted).
struct model_sizes : module_sizes {
  std::unordered_map<std::string, const module_tree*> modules;
  std::vector<std::vector<std::string>> tied_groups;
};

ACCEL_DECL std::int64_t tensor_bytes(const module_tensor& tensor, std::optional<std::int64_t> dtype_size);

template <class Visit>
void visit_modules(const module_tree& module, const std::string& full_name, const Visit& visit) {
  visit(module, full_name);
  for (const auto& child : module.children) visit_modules(child, joined(full_name, child.name), visit);
}

ACCEL_DECL model_sizes measure(const module_tree& root, std::optional<std::int64_t> dtype_size);

/// The children of `module` (named `full_name`) as Accelerate's `named_children` gives them: a module instance its
/// parent registers twice listed once.
ACCEL_DECL std::vector<item> children_of(const module_tree& module, const std::string& full_name);

/// A module's direct tensors then children: what it is replaced by when split (Accelerate leaves its buffers out).
ACCEL_DECL std::vector<item> split_items(const item& split);

ACCEL_DECL bool splittable(const item& entry, const std::vector<std::string>& no_split);

/// The largest layer among `items` (a layer: a module without children, one of a no-split class, or a tensor) and
/// the names of those of that size (Accelerate's `get_max_layer_size`).
ACCEL_DECL layer_size largest_layer(std::vector<item> items, const module_sizes& sizes,
                                    const std::vector<std::string>& no_split);

/// The entries `infer_auto_device_map` starts from: the root's own parameters, its children, its own buffers.
ACCEL_DECL std::vector<item> top_level_items(const module_tree& model);

ACCEL_DECL std::vector<item> modules_only(const std::vector<item>& items);

/// `name` lies in `outer` as Accelerate tests it: "outer." anywhere in "name." (a substring, not a prefix).
inline bool inside(const std::string& name, const std::string& outer) {
  return (name + ".").find(outer + ".") != std::string::npos;
}

/// The parameters tied to one inside `name` that lie outside it.
ACCEL_DECL std::vector<std::string> outside_ties(const std::string& name, const model_sizes& sizes);

/// The entries still to place that hold each tied parameter (first match, as Accelerate), and the size of the
/// module with them.
struct tied_size {
  std::int64_t bytes = 0;
  std::vector<item> holders;
};

ACCEL_DECL tied_size size_with_ties(const std::string& name, const std::vector<std::string>& tied,
                                    const model_sizes& sizes, const std::vector<item>& pending);

/// The margin `get_balanced_memory` adds to each GPU's even share: 1.25 x the larger of the biggest first no-split
/// module of each class and the mean size of the innermost modules holding tensors.
ACCEL_DECL std::int64_t balance_margin(const model_sizes& sizes, const std::vector<std::string>& no_split);

ACCEL_DECL void check_limits(const memory_limits& limits);

/// Throws unless each of `no_split` is the class of a module of `model`: a name that matches nothing would plan
/// another map than the user meant, silently (a typo, or a class written other than `Module::name()` gives it).
ACCEL_DECL void check_no_split_classes(const module_tree& model, const std::vector<std::string>& no_split);

/// The CPU's available memory (MemAvailable of /proc/meminfo, as psutil's `virtual_memory().available`; else the
/// free pages), in bytes.
ACCEL_DECL std::int64_t available_cpu_memory();

/// Free bytes of each CUDA device, through the CUDA runtime LibTorch's CUDA build loads (found in the process,
/// never loaded here); none where there is no such runtime or device.
ACCEL_DECL std::vector<std::int64_t> free_cuda_memory();

/// `get_balanced_memory`'s low_zero step: GPU 0 keeps what GPUs 1 to `gpus` - 1 cannot hold of the model's `total`
/// bytes (Accelerate's `range(1, num_devices)`, `gpus` those with memory), never more than its limit.
ACCEL_DECL void keep_gpu0_low(memory_limits& limits, std::size_t gpus, std::int64_t total);

/// Groups the entries under each module that all went to one device into that module (Accelerate's
/// `clean_device_map`), in place of its first entry.
ACCEL_DECL void clean(device_map& map, const std::string& module_name);

/// The placing loop of Accelerate's `infer_auto_device_map`: one entry at a time, on the current device if it fits
/// with its ties (less the room kept for the largest layer on GPU 0 and the CPU), else a tie or the entry split, else
/// the next device.
class planner {
 public:
  ACCEL_DECL planner(const module_tree& model, const memory_limits& limits, const device_map_options& options);

  ACCEL_DECL device_map plan();

 private:
  [[nodiscard]] ACCEL_DECL bool keeps_room(const map_device& device) const;

  ACCEL_DECL void step();

  ACCEL_DECL void place(const item& entry, const tied_size& with_ties, const map_device& device);

  ACCEL_DECL bool split_a_tie(const item& entry, const tied_size& with_ties);

  ACCEL_DECL void refresh_largest();

  [[noreturn]] ACCEL_DECL void refuse(const item& entry) const;

  model_sizes sizes_;
  std::vector<std::string> no_split_;
  memory_limits limits_;
  bool to_disk_;
  std::vector<map_device> devices_;
  std::size_t current_ = 0;
  std::map<map_device, std::int64_t> used_;
  std::vector<item> pending_;
  layer_size largest_;
  device_map map_;
};

}  // namespace detail::device_planning

// The functions below that take accel's types are function objects: argument-dependent lookup finds no object, so
// a program's own function of one of these names, called unqualified with accel's types, stays its own (and
// unambiguous) when accel adds a name.

/// Accelerate's `compute_module_sizes`: the bytes of every module and tensor of `model`, each floating tensor counted
/// at `dtype_size` bytes an element when that is smaller (the dtype it would be loaded as).
struct compute_module_sizes_function {
  [[nodiscard]] ACCEL_DECL module_sizes operator()(const module_tree& model,
                                                   std::optional<std::int64_t> dtype_size = std::nullopt) const;
};
inline constexpr compute_module_sizes_function compute_module_sizes{};

/// Accelerate's `get_max_layer_size` over the model's top-level entries (its own parameters, children and buffers, as
/// `infer_auto_device_map` starts): the largest layer and the names of those of its size, with `sizes` from
/// `compute_module_sizes`. A layer is a module without children, a module of a class in
/// `no_split_module_classes`, or a tensor.
struct get_max_layer_size_function {
  [[nodiscard]] ACCEL_DECL layer_size operator()(const module_tree& model, const module_sizes& sizes,
                                                 const std::vector<std::string>& no_split_module_classes) const;
};
inline constexpr get_max_layer_size_function get_max_layer_size{};

/// Accelerate's `get_max_memory()` without arguments: what each CUDA device has free (where LibTorch's CUDA build
/// runs), then the CPU's available memory. What `infer_auto_device_map` and `get_balanced_memory` plan with when
/// `max_memory` is empty.
ACCEL_DECL memory_limits get_max_memory();

/// Accelerate's `get_balanced_memory`: lowers every GPU's limit but the last one's to the model's even share plus a
/// margin (1.25 x the larger of the first no-split module's size of each class and the mean size of the innermost
/// modules), so that the plan spreads the model over the GPUs; `low_zero` keeps on GPU 0 only what the other GPUs
/// cannot hold (a GPU 0 given 0 bytes stays at 0). One GPU or none: the limits unchanged, but with `max_memory` empty
/// (measured by `get_max_memory`) a single GPU keeps 10% back, as Accelerate does.
struct get_balanced_memory_function {
  [[nodiscard]] ACCEL_DECL memory_limits operator()(const module_tree& model, memory_limits max_memory,
                                                    const std::vector<std::string>& no_split_module_classes,
                                                    bool low_zero = false,
                                                    std::optional<std::int64_t> dtype_size = std::nullopt) const;
};
inline constexpr get_balanced_memory_function get_balanced_memory{};

/// Accelerate's `infer_auto_device_map` (after `get_balanced_memory` for the balanced strategies, as its
/// `load_checkpoint_and_dispatch` does): the device of each module or tensor, filling GPUs in order, then the CPU,
/// then disk. Throws `device_map_error` for a bad limit, a no-split class that no module has or, with
/// `offload_to_disk` false, for a plan that needs disk (naming the first entry that goes there and what would make it
/// fit).
struct infer_auto_device_map_function {
  [[nodiscard]] ACCEL_DECL device_map operator()(const module_tree& model, const device_map_options& options) const;
};
inline constexpr infer_auto_device_map_function infer_auto_device_map{};

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/device_map.ipp"
#endif
