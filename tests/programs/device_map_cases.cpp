// Reads module trees and memory settings from stdin (the format check_device_map.py writes) and prints
// accel::infer_auto_device_map's map for each, or its refusal, for the script to compare with Accelerate's; or, for
// a case that says `report sizes`, accel::compute_module_sizes (a line per name, in order) and get_max_layer_size.
//   case ID / strategy NAME / memory DEVICE:BYTES ... / nosplit CLASS ... / dtype BYTES|- / report sizes /
//   module DEPTH NAME|- CLASS SHARED_WITH|- / param NAME ELEMENTS ELEMENT_SIZE FLOATING TIED_TO|- /
//   buffer NAME ELEMENTS ELEMENT_SIZE FLOATING TIED_TO|- / end
#include <accel/device_map.hpp>

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

accel::device_map_strategy strategy_named(const std::string& name) {
  if (name == "sequential") return accel::device_map_strategy::sequential;
  if (name == "balanced") return accel::device_map_strategy::balanced;
  if (name == "balanced_low_0") return accel::device_map_strategy::balanced_low_0;
  if (name == "auto") return accel::device_map_strategy::automatic;
  throw std::runtime_error("unknown strategy " + name);
}

accel::map_device device_named(const std::string& name) {
  if (name == "cpu") return accel::map_device::cpu();
  if (name == "disk") return accel::map_device::disk();
  return accel::map_device::gpu(std::stoi(name));
}

accel::module_tensor tensor_from(std::istringstream& words) {
  accel::module_tensor tensor;
  int floating = 1;
  words >> tensor.name >> tensor.elements >> tensor.element_size >> floating >> tensor.tied_to;
  tensor.floating_point = floating != 0;
  if (tensor.tied_to == "-") tensor.tied_to.clear();
  return tensor;
}

/// The module at `depth`, along the last children (the tree is written in pre-order).
accel::module_tree& last_at(accel::module_tree& root, int depth) {
  accel::module_tree* module = &root;
  for (int d = 0; d < depth; ++d) module = &module->children.back();
  return *module;
}

struct parsed_case {
  std::string id;
  accel::module_tree model;
  accel::device_map_options options;
  bool report_sizes = false;
  int depth = -1;
};

void read_line(parsed_case& current, const std::string& line) {
  std::istringstream words(line);
  std::string key;
  words >> key;
  if (key == "case") words >> current.id;
  if (key == "strategy") current.options.strategy = strategy_named((words >> key, key));
  for (std::string entry; key == "memory" && words >> entry;) {
    const auto colon = entry.find(':');
    current.options.max_memory[device_named(entry.substr(0, colon))] = std::stoll(entry.substr(colon + 1));
  }
  for (std::string name; key == "nosplit" && words >> name;) current.options.no_split_module_classes.push_back(name);
  if (key == "dtype" && (words >> key, key != "-")) current.options.dtype_size = std::stoll(key);
  if (key == "report") current.report_sizes = true;
  if (key == "module") {
    words >> current.depth;
    std::string name, class_name, shared_with;
    words >> name >> class_name >> shared_with;
    accel::module_tree module{.name = name, .class_name = class_name, .shared_with = shared_with};
    if (module.shared_with == "-") module.shared_with.clear();
    if (current.depth == 0) {
      module.name.clear();
      current.model = module;
    } else {
      last_at(current.model, current.depth - 1).children.push_back(module);
    }
  }
  if (key == "param") last_at(current.model, current.depth).parameters.push_back(tensor_from(words));
  if (key == "buffer") last_at(current.model, current.depth).buffers.push_back(tensor_from(words));
}

void print_sizes(const parsed_case& measured) {
  std::cout << "case " << measured.id << "\n";
  const auto sizes = accel::compute_module_sizes(measured.model, measured.options.dtype_size);
  for (const auto& [name, bytes] : sizes.entries()) std::cout << (name.empty() ? "-" : name) << " " << bytes << "\n";
  const auto largest = accel::get_max_layer_size(measured.model, sizes, measured.options.no_split_module_classes);
  std::cout << "@largest " << largest.bytes;
  for (const auto& name : largest.names) std::cout << " " << name;
  std::cout << "\n";
}

void print_plan(const parsed_case& planned) {
  std::cout << "case " << planned.id << "\n";
  try {
    for (const auto& [name, device] : accel::infer_auto_device_map(planned.model, planned.options))
      std::cout << (name.empty() ? "-" : name) << " " << device.str() << "\n";
  } catch (const accel::device_map_error& e) {
    std::cout << "error " << e.what() << "\n";
  }
}

}  // namespace

int main() {
  parsed_case current;
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "end") {
      if (current.report_sizes)
        print_sizes(current);
      else
        print_plan(current);
      current = {};
      continue;
    }
    read_line(current, line);
  }
  return 0;
}
