/// \file
/// What collectives.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../collectives.hpp"

#include "../detail/support/pickle_functions.hpp"

namespace accel {

local_communicator::work local_communicator::all_gather_into(at::Tensor& output, const at::Tensor& input) {
  output.copy_(input);
  return {};
}

local_communicator::work local_communicator::reduce_scatter_into(at::Tensor& output, const at::Tensor& input) {
  output.copy_(input);
  return {};
}
}  // namespace accel

namespace accel::detail {

bool debug_mode() {
  static const bool enabled = [] {
    const char* value = std::getenv("ACCELERATE_DEBUG_MODE");
    if (value == nullptr) return false;
    std::string text(value);
    std::ranges::transform(text, text.begin(), [](unsigned char c) { return std::tolower(c); });
    return text == "1" || text == "true" || text == "yes" || text == "on";
  }();
  return enabled;
}

std::string shape_text(at::IntArrayRef shape) {
  std::ostringstream text;
  text << shape;
  return text.str();
}

std::vector<char> pickle_bytes(const c10::IValue& value) { return torch::jit::pickle_save(value); }

c10::IValue unpickle_bytes(const std::vector<char>& bytes) { return torch::jit::pickle_load(bytes); }

}  // namespace accel::detail
