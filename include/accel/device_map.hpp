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

/// A parameter or buffer of a module: its name in that module, its size, and, for a parameter that is the same tensor
/// as one met before it (a tied weight), the full name of that first one (its bytes count there, once).
struct module_tensor {
  std::string name{};
  std::int64_t elements = 0;
  std::int64_t element_size = 4;
  bool floating_point = true;  ///< integer and bool tensors keep their size when a dtype is given, as Accelerate's
  std::string tied_to{};       ///< empty: not tied; else the full name of the parameter it shares
};

/// One module: its name in its parent ("" for the root), its class name (what `no_split_module_classes` names), its
/// own parameters and buffers, and its children in registration order.
struct module_tree {
  std::string name{};
  std::string class_name{};
  std::vector<module_tensor> parameters{};
  std::vector<module_tensor> buffers{};
  std::vector<module_tree> children{};
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
  memory_limits max_memory{};                          ///< required: accel does not probe free memory here
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

/// The model's sizes: every module and tensor name (and "") to its bytes, in the order Accelerate's
/// `compute_module_sizes` meets them (parameters of the whole model first, then buffers; tied copies count once).
struct model_sizes {
  std::unordered_map<std::string, std::int64_t> bytes;
  std::vector<std::string> order;
  std::unordered_map<std::string, const module_tree*> modules;
  std::vector<std::vector<std::string>> tied_groups;

  [[nodiscard]] ACCEL_DECL std::int64_t of(const std::string& name) const;
  [[nodiscard]] std::int64_t total() const { return of(""); }
};

ACCEL_DECL std::int64_t tensor_bytes(const module_tensor& tensor, std::optional<std::int64_t> dtype_size);

ACCEL_DECL void add_tensor(model_sizes& sizes, const std::string& full_name, std::int64_t bytes);

template <class Visit>
void visit_modules(const module_tree& module, const std::string& full_name, const Visit& visit) {
  visit(module, full_name);
  for (const auto& child : module.children) visit_modules(child, joined(full_name, child.name), visit);
}

ACCEL_DECL model_sizes measure(const module_tree& root, std::optional<std::int64_t> dtype_size);

/// A module's direct tensors then children: what it is replaced by when split (Accelerate leaves its buffers out).
ACCEL_DECL std::vector<item> split_items(const item& split);

ACCEL_DECL bool splittable(const item& entry, const std::vector<std::string>& no_split);

/// The largest layer among `items` (a layer: a module without children, one of a no-split class, or a tensor) and
/// the names of those of that size (Accelerate's `get_max_layer_size`).
ACCEL_DECL std::pair<std::int64_t, std::vector<std::string>> largest_layer(std::vector<item> items,
                                                                           const model_sizes& sizes,
                                                                           const std::vector<std::string>& no_split);

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
  std::int64_t largest_ = 0;
  std::vector<std::string> largest_names_;
  device_map map_;
};

}  // namespace detail::device_planning

/// Accelerate's `get_balanced_memory`: lowers every GPU's limit but the last one's to the model's even share plus a
/// margin (1.25 x the larger of the first no-split module's size of each class and the mean size of the innermost
/// modules), so that the plan spreads the model over the GPUs; `low_zero` keeps on GPU 0 only what the other GPUs
/// cannot hold. One GPU or none: the limits unchanged.
ACCEL_DECL memory_limits get_balanced_memory(const module_tree& model, memory_limits max_memory,
                                             const std::vector<std::string>& no_split_module_classes,
                                             bool low_zero = false,
                                             std::optional<std::int64_t> dtype_size = std::nullopt);

/// Accelerate's `infer_auto_device_map` (after `get_balanced_memory` for the balanced strategies, as its
/// `load_checkpoint_and_dispatch` does): the device of each module or tensor, filling GPUs in order, then the CPU,
/// then disk. Throws `device_map_error` for a bad limit or, with `offload_to_disk` false, for a plan that needs disk
/// (naming the first entry that goes there and what would make it fit).
ACCEL_DECL device_map infer_auto_device_map(const module_tree& model, const device_map_options& options);

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/device_map.ipp"
#endif
