/// \file
/// Run-time choice among compile-time configurations: a program compiles the few accelerators it supports,
///
///     using supported = accel::configs<accel::accelerator<>,
///                                      accel::accelerator<accel::bf16, accel::data_parallel<accel::gloo>>,
///                                      accel::accelerator<accel::bf16, accel::data_parallel<accel::gloo>,
///                                                         accel::accumulate<4>>>;
///     accel::dispatch<supported>(accel::read_run_config(), [&](auto& acc) { train(acc); });
///
/// and `dispatch` builds the first one that fits the run configuration (from Accelerate's environment variables
/// or the config file, and the launcher's world size) and calls the function once with it: the loop inside is compiled
/// per configuration, with no dispatch in it. A configuration that was not compiled gives an error that lists those
/// that were.
#pragma once

#include <cstdlib>
#include <memory>
#include <optional>
#include <tuple>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "accelerator.hpp"
#include "config_file.hpp"
#include "launch.hpp"

namespace accel {

/// The configurations a program compiled, in order of preference.
template <class... Accelerators>
struct configs {};

/// What a run asks for: Accelerate's `ACCELERATE_MIXED_PRECISION` (`no`, `bf16`, `fp16`),
/// `ACCELERATE_GRADIENT_ACCUMULATION_STEPS`, and the number of processes the launcher started.
struct run_config {
  std::string mixed_precision = "no";
  int gradient_accumulation_steps = 1;
  int num_processes = 1;
};

/// The run configuration: each setting from its environment variable when set, otherwise from the config file
/// (see config_file.hpp: `accel config` writes it), otherwise the default; the number of processes from the
/// launcher. Throws config_error for a value that is not accepted, naming the variable or file (and
/// std::invalid_argument for a malformed ACCELERATE_GRADIENT_ACCUMULATION_STEPS, as the accumulation policies do).
inline run_config read_run_config() {
  config_values values = read_config_file();
  if (const char* precision = std::getenv("ACCELERATE_MIXED_PRECISION"); precision != nullptr && *precision != '\0')
    set_config_value(values, "mixed_precision", precision, "ACCELERATE_MIXED_PRECISION");
  if (const auto steps = detail::accumulation_steps_in_environment()) values.gradient_accumulation_steps = *steps;
  run_config config;
  config.mixed_precision = values.mixed_precision.value_or(config.mixed_precision);
  config.gradient_accumulation_steps = values.gradient_accumulation_steps.value_or(1);
  config.num_processes = read_process_environment().world_size;
  return config;
}

namespace detail {

template <class Accelerator>
struct config_traits;

template <class P, class Q, class A>
struct config_traits<accelerator<P, Q, A>> {
  static bool fits(const run_config& c) {
    if (c.mixed_precision != P::mixed_precision()) return false;
    if constexpr (always_one_process<Q>)
      if (c.num_processes != 1) return false;
    if constexpr (requires { std::integral_constant<int, A::steps()>::value; })
      return A::steps() == c.gradient_accumulation_steps;
    else
      return true;  // accumulate_dynamic takes any N (from the same variable)
  }
  static std::string name() {
    return "accelerator<" + std::string(P::name()) + ", " + std::string(Q::name()) + ", " + std::string(A::name()) +
           ">";
  }
};

/// The options with the run's accumulation steps filled in when they leave them open, so that
/// accumulate_dynamic uses a number that came from the config file (the environment variable wins anyway).
inline options with_accumulation_steps(options opts, const run_config& config) {
  if (!opts.gradient_accumulation_steps) opts.gradient_accumulation_steps = config.gradient_accumulation_steps;
  return opts;
}

}  // namespace detail

/// Builds the first of `Configs`' accelerators that fits `config` (with `opts`) and returns `f(accelerator)`: a
/// value (moved out before the accelerator is destroyed), a reference (as it is), or nothing.
/// Throws `std::invalid_argument` listing the compiled configurations when none fits.
template <class Configs, class F>
decltype(auto) dispatch(const run_config& config, F&& f, const options& opts = {});

namespace detail {
/// What `f` returns for the first configuration: `dispatch`'s result type.
template <class F, class... Accelerators>
using dispatch_result = std::invoke_result_t<F&, std::tuple_element_t<0, std::tuple<Accelerators...>>&>;

/// Where `dispatch` keeps `f`'s result while the accelerator that made it is destroyed: a value in place, a
/// reference as a pointer (an optional cannot hold one), nothing for void.
template <class Result>
using dispatch_slot =
    std::conditional_t<std::is_void_v<Result>, bool,
                       std::conditional_t<std::is_reference_v<Result>, std::remove_reference_t<Result>*, Result>>;

template <class... Accelerators, class F>
auto dispatch_in(configs<Accelerators...>, const run_config& config, F&& f, const options& opts)
    -> dispatch_result<F, Accelerators...> {
  using result = dispatch_result<F, Accelerators...>;
  std::optional<dispatch_slot<result>> out;
  const bool found = ([&]<class Accelerator>(std::type_identity<Accelerator>) {
    if (!config_traits<Accelerator>::fits(config)) return false;
    Accelerator acc(with_accumulation_steps(opts, config));
    if constexpr (std::is_void_v<result>) {
      f(acc);
      out.emplace(true);
    } else if constexpr (std::is_reference_v<result>) {
      auto&& returned = f(acc);
      out.emplace(std::addressof(returned));
    } else {
      out.emplace(f(acc));
    }
    return true;
  }(std::type_identity<Accelerators>{}) ||
                      ...);
  if (!found) {
    std::string compiled;
    ((compiled += "\n  " + config_traits<Accelerators>::name()), ...);
    throw std::invalid_argument(
        "accel::dispatch: no compiled configuration fits mixed_precision=" + config.mixed_precision +
        ", gradient_accumulation_steps=" + std::to_string(config.gradient_accumulation_steps) +
        ", processes=" + std::to_string(config.num_processes) + "; the program was compiled with:" + compiled);
  }
  if constexpr (std::is_reference_v<result>)
    return static_cast<result>(**out);
  else if constexpr (!std::is_void_v<result>)
    return std::move(*out);
}
}  // namespace detail

template <class Configs, class F>
decltype(auto) dispatch(const run_config& config, F&& f, const options& opts) {
  return detail::dispatch_in(Configs{}, config, std::forward<F>(f), opts);
}

}  // namespace accel
