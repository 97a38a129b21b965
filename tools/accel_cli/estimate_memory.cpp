// `accel estimate-memory`: reads the headers of a safetensors file (or of every file a Hugging Face index names),
// never their data, and prints accel::estimate_training_bytes for each precision, policy and number of processes.
#include "estimate_memory.hpp"

#include <accel/detail/support/safetensors_header.hpp>
#include <accel/memory_estimate.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <new>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "arguments.hpp"

namespace accel::cli {
namespace {

// The longest --shard_units pattern, and tensor name it is matched against: std::regex compiles and matches by
// recursion, a level per character, so longer text could overflow the stack. Real names are under 200 characters.
constexpr std::size_t longest_shard_units_text = 1024;

struct estimate_request {
  std::string model;
  std::vector<int> processes{1, 2, 4, 8};
  std::string optimizer = "adamw";
  std::vector<std::string> precisions{"no", "bf16", "fp16"};
  bool exact_bytes = false;
  /// Names a tensor's shard unit under fully_sharded: the text this expression matches at the start of its name
  /// (`block[0-9]+`, `model\.layers\.[0-9]+`); tensors whose names it does not match are outside every unit.
  std::optional<std::string> shard_units;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) items.push_back(item);
  return items;
}

// Applies one option (`i` moves past a value given as the next argument).
void apply_option(estimate_request& request, const std::vector<std::string>& args, std::size_t& i) {
  const option_token option = split_option(args[i]);
  if (option.name == "bytes") {
    request.exact_bytes = true;
    return;
  }
  bool used_next = false;
  const auto value = option_value(option, i + 1 < args.size() ? &args[i + 1] : nullptr, used_next);
  if (used_next) ++i;
  if (option.name == "num_processes") {
    request.processes.clear();
    for (const auto& item : split_list(value))
      request.processes.push_back(static_cast<int>(parse_whole_number(option, item, 1, 1 << 20, "processes")));
    if (request.processes.empty()) throw usage_error("--num_processes needs at least one number, e.g. 1,2,4,8");
  } else if (option.name == "optimizer") {
    try {
      optimizer_state_tensors(value);
    } catch (const std::invalid_argument& e) {
      throw usage_error(e.what());
    }
    request.optimizer = value;
  } else if (option.name == "mixed_precision") {
    request.precisions = split_list(value);
    for (const auto& p : request.precisions)
      if (p != "no" && p != "bf16" && p != "fp16")
        throw usage_error("--mixed_precision takes no, bf16 and fp16 (comma-separated), not '" + p + "'");
  } else if (option.name == "shard_units") {
    if (value.size() > longest_shard_units_text)
      throw usage_error("--shard_units is " + std::to_string(value.size()) + " characters long; at most " +
                        std::to_string(longest_shard_units_text) +
                        " are taken (std::regex recurses once per character): give a shorter pattern");
    try {
      std::regex{value};
    } catch (const std::regex_error& e) {
      throw usage_error("--shard_units takes a regular expression (e.g. 'model\\.layers\\.[0-9]+'); '" + value +
                        "' is not one: " + e.what());
    }
    request.shard_units = value;
  } else {
    throw usage_error("unknown option " + option.spelling +
                      "; the options are --num_processes, --optimizer, --mixed_precision, --shard_units and --bytes");
  }
}

estimate_request parse_request(const std::vector<std::string>& args) {
  estimate_request request;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i].starts_with("-")) {
      apply_option(request, args, i);
    } else if (request.model.empty()) {
      request.model = args[i];
    } else {
      throw usage_error("one model only: '" + request.model + "' and '" + args[i] + "' given");
    }
  }
  if (request.model.empty()) throw usage_error("expected a model: a .safetensors file or a .safetensors.index.json");
  return request;
}

/// The most bytes a model may have for the estimate: its formulas multiply the model's bytes by a few and stay within
/// 64 bits below this.
constexpr std::int64_t max_model_bytes = std::int64_t{1} << 50;

// Bytes per element of a safetensors dtype, and whether an optimizer trains such a tensor (floating point).
accel::tensor_extent extent_of(const safetensors::detail::header_parser::entry& entry, const std::string& file,
                               const std::string& name) {
  const auto where = file + ": tensor " + name;
  static const std::map<std::string, std::pair<int, bool>> dtypes = {
      {"F64", {8, true}},      {"F32", {4, true}},      {"F16", {2, true}},  {"BF16", {2, true}},
      {"F8_E4M3", {1, false}}, {"F8_E5M2", {1, false}}, {"I64", {8, false}}, {"I32", {4, false}},
      {"I16", {2, false}},     {"I8", {1, false}},      {"U8", {1, false}},  {"BOOL", {1, false}}};
  const auto found = dtypes.find(entry.dtype);
  if (found == dtypes.end())
    throw std::runtime_error(where + " has the dtype " + entry.dtype +
                             ", which the estimate does not know (it knows F64, F32, F16, BF16, F8_E4M3, F8_E5M2, "
                             "I64, I32, I16, I8, U8 and BOOL)");
  const auto elements = safetensors::detail::element_count(entry.shape, name, file);
  if (elements > max_model_bytes / found->second.first)
    throw std::runtime_error(where + " has " + std::to_string(elements) + " elements, more bytes than the estimate " +
                             "counts (2^50, a pebibyte); the header is corrupt or hostile");
  const bool floating = entry.dtype.starts_with("F") || entry.dtype == "BF16";
  return {.elements = elements,
          .element_size = found->second.first,
          .trainable = found->second.second,
          .floating_point = floating};
}

/// Numbers shard units by the text `pattern` matches at the start of tensor names (the same text, the same unit).
/// A name longer than longest_shard_units_text is refused: std::regex_search recurses once per character, and a
/// hostile file's 300,000-character name overflowed the stack (a SIGSEGV, issue 56).
class unit_namer {
 public:
  explicit unit_namer(const std::optional<std::string>& pattern) {
    if (pattern) pattern_ = std::regex(*pattern);
  }
  int operator()(const std::string& tensor, const std::string& where) {
    if (pattern_ && tensor.size() > longest_shard_units_text)
      throw usage_error(where + " has a name of " + std::to_string(tensor.size()) + " characters; --shard_units " +
                        "matches names of at most " + std::to_string(longest_shard_units_text) +
                        " (a longer one is not a model's): check the file");
    std::smatch found;
    if (!pattern_ || !std::regex_search(tensor, found, *pattern_, std::regex_constants::match_continuous) ||
        found.length(0) == 0)
      return -1;
    return units_.try_emplace(found.str(0), static_cast<int>(units_.size())).first->second;
  }
  [[nodiscard]] std::size_t count() const noexcept { return units_.size(); }

 private:
  std::optional<std::regex> pattern_;
  std::map<std::string, int> units_;
};

/// The header of `file`: an error that would not say which file (an allocation that failed, a number out of range)
/// is given its name.
safetensors::detail::file_header header_of(const std::filesystem::path& file) {
  try {
    return safetensors::detail::read_header(file);
  } catch (const checkpoint_error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw std::runtime_error(file.string() + ": its header does not fit in memory (a corrupt or hostile length?)");
  } catch (const std::exception& e) {
    throw std::runtime_error(file.string() + ": its header cannot be read (" + e.what() + ")");
  }
}

std::vector<accel::tensor_extent> read_extents(const estimate_request& request) {
  const std::filesystem::path model = request.model;
  std::vector<std::filesystem::path> files{model};
  if (model.string().ends_with(".json")) files = safetensors::detail::index_files(model);
  std::vector<accel::tensor_extent> extents;
  unit_namer unit_of(request.shard_units);
  std::string first_name;
  std::int64_t model_bytes = 0;
  for (const auto& file : files)
    for (const auto& [name, entry] : header_of(file).entries) {
      extents.push_back(extent_of(entry, file.string(), name));
      extents.back().shard_unit = unit_of(name, file.string() + ": a tensor");
      model_bytes += extents.back().elements * extents.back().element_size;
      if (model_bytes > max_model_bytes)
        throw std::runtime_error(file.string() + ": with tensor " + name + " the model passes 2^50 bytes (a " +
                                 "pebibyte), more than the estimate counts; a header is corrupt or hostile");
      if (first_name.empty()) first_name = name;
    }
  if (request.shard_units && unit_of.count() == 0)
    throw usage_error("--shard_units '" + *request.shard_units + "' matches the start of no tensor's name in " +
                      request.model + " (the first is '" + first_name +
                      "'): it should match the unit's part of the names, e.g. 'model\\.layers\\.[0-9]+'");
  return extents;
}

std::string readable(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) value /= 1024, ++unit;
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return text;
}

void print_summary(const estimate_request& request, const std::vector<accel::tensor_extent>& extents) {
  std::int64_t elements = 0, trainable = 0, bytes = 0;
  for (const auto& e : extents) {
    elements += e.elements;
    trainable += e.trainable ? e.elements : 0;
    bytes += e.elements * e.element_size;
  }
  std::printf("Memory per process to train %s with %s: %lld parameters (%lld trainable), %s in the file.\n",
              request.model.c_str(), request.optimizer.c_str(), static_cast<long long>(elements),
              static_cast<long long>(trainable), readable(bytes).c_str());
  std::printf(
      "Parameters, gradients, gradient buckets and optimizer state (docs/big-models.md), without activations and\n"
      "communication buffers: between steps, and the most a step holds at once (fully_sharded %s; bf16 and fp16\n"
      "keep float32 master weights and add the forward's 16-bit casts).\n\n",
      request.shard_units ? "gathers one shard unit at a time, as --shard_units names them"
                          : "gathers the whole model: --shard_units names its units");
}

}  // namespace

int estimate_memory_main(const std::vector<std::string>& args) {
  if (!args.empty() && (split_option(args[0]).name == "help" || split_option(args[0]).name == "h")) {
    std::puts(
        "usage: accel estimate-memory MODEL.safetensors|model.safetensors.index.json [--num_processes 1,2,4,8]\n"
        "                             [--optimizer adamw|adam|sgd|sgd_momentum|rmsprop|adagrad]\n"
        "                             [--mixed_precision no,bf16,fp16] [--shard_units REGEX] [--bytes]\n\n"
        "Reads the model's safetensors headers only (never the weights) and prints the bytes each process holds to\n"
        "train it under data_parallel, zero1, zero2 and fully_sharded, for each precision and number of processes:\n"
        "accel::estimate_training_bytes (accel/memory_estimate.hpp). --shard_units names fully_sharded's shard\n"
        "units: the text the expression matches at the start of a tensor's name is its unit\n"
        "('model\\.layers\\.[0-9]+' makes each layer one); without it, fully_sharded gathers the whole model for a\n"
        "step. --bytes prints exact byte counts, one line each: precision, policy, processes, bytes between steps,\n"
        "bytes at a step's peak.");
    return exit_ok;
  }
  const auto request = parse_request(args);
  const auto extents = read_extents(request);
  const std::pair<const char*, accel::sharding_stage> stages[] = {
      {"data_parallel", accel::sharding_stage::data_parallel},
      {"zero1", accel::sharding_stage::zero1},
      {"zero2", accel::sharding_stage::zero2},
      {"fully_sharded", accel::sharding_stage::fully_sharded}};
  if (!request.exact_bytes) {
    print_summary(request, extents);
    std::printf("%-9s  %-13s  %9s  %14s  %14s\n", "precision", "policy", "processes", "between steps", "step peak");
  }
  for (const auto& precision : request.precisions)
    for (const auto& [name, stage] : stages)
      for (const int processes : request.processes) {
        const auto bytes =
            accel::estimate_training_bytes(extents, {.stage = stage,
                                                     .processes = processes,
                                                     .state_tensors = accel::optimizer_state_tensors(request.optimizer),
                                                     .autocast_16bit = precision != "no"});
        if (request.exact_bytes)
          std::printf("%s %s %d %lld %lld\n", precision.c_str(), name, processes,
                      static_cast<long long>(bytes.at_rest()), static_cast<long long>(bytes.step_peak()));
        else
          std::printf("%-9s  %-13s  %9d  %14s  %14s\n", precision.c_str(), name, processes,
                      readable(bytes.at_rest()).c_str(), readable(bytes.step_peak()).c_str());
      }
  return exit_ok;
}

}  // namespace accel::cli
