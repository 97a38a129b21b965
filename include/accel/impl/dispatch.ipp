/// \file
/// What dispatch.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../dispatch.hpp"

namespace accel::detail {

std::optional<std::string> distributed_type_in_environment() {
  for (const auto& [variable, type] :
       {std::pair{"ACCELERATE_USE_DEEPSPEED", "DEEPSPEED"}, std::pair{"ACCELERATE_USE_FSDP", "FSDP"}}) {
    const char* value = std::getenv(variable);
    if (value == nullptr || *value == '\0') continue;
    std::string text(value);
    std::ranges::transform(text, text.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (text == "1" || text == "true" || text == "yes" || text == "y" || text == "t" || text == "on") return type;
    if (text != "0" && text != "false" && text != "no" && text != "n" && text != "f" && text != "off")
      throw config_error(std::string(variable) + " must be true or false (or 1/0, yes/no, on/off), not '" +
                         detail::excerpt(text) + "'");
  }
  return std::nullopt;
}
}  // namespace accel::detail

namespace accel {

run_config read_run_config() {
  config_values values = read_config_file();
  if (const char* precision = std::getenv("ACCELERATE_MIXED_PRECISION"); precision != nullptr && *precision != '\0')
    set_config_value(values, "mixed_precision", precision, "ACCELERATE_MIXED_PRECISION");
  if (const auto steps = detail::accumulation_steps_in_environment()) values.gradient_accumulation_steps = *steps;
  if (auto type = detail::distributed_type_in_environment()) values.distributed_type = std::move(type);
  run_config config;
  config.mixed_precision = values.mixed_precision.value_or(config.mixed_precision);
  config.gradient_accumulation_steps = values.gradient_accumulation_steps.value_or(1);
  config.num_processes = read_process_environment().world_size;
  config.distributed_type = values.distributed_type.value_or("");
  return config;
}
}  // namespace accel

namespace accel::detail {

options with_accumulation_steps(options opts, const run_config& config) {
  if (!opts.gradient_accumulation_steps) opts.gradient_accumulation_steps = config.gradient_accumulation_steps;
  return opts;
}

}  // namespace accel::detail
