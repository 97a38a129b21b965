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
/// that were. Each policy says what selects it: the precision policy's `mixed_precision()`, the parallel policy's
/// `distributed_type()` (Accelerate's `NO`, `MULTI_CPU`, `MULTI_GPU`, `FSDP`, `DEEPSPEED`), the accumulation
/// policy's constant `steps()`; an entry that an earlier one always wins over is a compile error.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <optional>
#include <tuple>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "detail/config.hpp"
#include "accelerator.hpp"
#include "config_file.hpp"
#include "launch.hpp"

namespace accel {

/// The configurations a program compiled, in order of preference.
template <class... Accelerators>
struct configs {};

/// What a run asks for: Accelerate's `ACCELERATE_MIXED_PRECISION` (`no`, `bf16`, `fp16`, `fp8`),
/// `ACCELERATE_GRADIENT_ACCUMULATION_STEPS`, the number of processes the launcher started, and the distributed
/// type (`NO`, `MULTI_CPU`, `MULTI_GPU`, `FSDP`, `DEEPSPEED`; empty when the run names none: then any parallel policy
/// that fits the number of processes).
struct run_config {
  std::string mixed_precision = "no";
  int gradient_accumulation_steps = 1;
  int num_processes = 1;
  std::string distributed_type = "";
};

namespace detail {
/// Accelerate's `ACCELERATE_USE_DEEPSPEED` and `ACCELERATE_USE_FSDP` (set by `accelerate launch` from the config
/// file's distributed_type), in the order Accelerate reads them: the distributed type the first that is true names.
ACCEL_DECL std::optional<std::string> distributed_type_in_environment();
}  // namespace detail

/// The run configuration: each setting from its environment variable when set, otherwise from the config file
/// (see config_file.hpp: `accel config` writes it), otherwise the default; the number of processes from the
/// launcher. The distributed type: `DEEPSPEED` or `FSDP` when `ACCELERATE_USE_DEEPSPEED` or `ACCELERATE_USE_FSDP` is
/// true, else the config file's `distributed_type`, else none. Throws config_error for a value that is not accepted,
/// naming the variable or file (and std::invalid_argument for a malformed ACCELERATE_GRADIENT_ACCUMULATION_STEPS, as
/// the accumulation policies do).
ACCEL_DECL run_config read_run_config();

namespace detail {

template <class Accelerator>
struct config_traits;

template <class P, class Q, class A>
struct config_traits<accelerator<P, Q, A>> {
  static constexpr std::string_view mixed_precision = P::mixed_precision();
  static constexpr std::string_view distributed_type = Q::distributed_type();
  static constexpr bool one_process = always_one_process<Q>;
  static constexpr bool any_steps = !requires { std::integral_constant<int, A::steps()>::value; };
  static constexpr int steps() {
    if constexpr (any_steps)
      return 0;
    else
      return A::steps();
  }

  static bool fits(const run_config& c) {
    if (c.mixed_precision != mixed_precision) return false;
    if (!c.distributed_type.empty() && c.distributed_type != distributed_type) return false;
    if (one_process && c.num_processes != 1) return false;
    return any_steps || steps() == c.gradient_accumulation_steps;  // accumulate_dynamic takes any N
  }
  static std::string name() {
    return "accelerator<" + std::string(P::name()) + ", " + std::string(Q::name()) + ", " + std::string(A::name()) +
           ">" + (distributed_type.empty() ? "" : " (" + std::string(distributed_type) + ")");
  }
};

/// Whether `Earlier` fits every run configuration that `Later` fits, so that `dispatch` never reaches `Later`.
template <class Earlier, class Later>
constexpr bool shadows() {
  using e = config_traits<Earlier>;
  using l = config_traits<Later>;
  return e::mixed_precision == l::mixed_precision &&
         (l::distributed_type.empty() || e::distributed_type == l::distributed_type) &&
         (!e::one_process || l::one_process) && (e::any_steps || (!l::any_steps && e::steps() == l::steps()));
}

/// The compile error for entry `Later` of `configs<...>` (counted from 0), which no run configuration selects: one
/// of the entries before it always wins, or its precision policy names no `mixed_precision` value.
template <std::size_t Later, bool Shadowed, bool Unselectable>
struct reachable_entry {
  static_assert(!Unselectable,
                "accel::configs<...>: an entry can never be chosen (its index is this template's first argument): its "
                "precision policy's mixed_precision() is empty, which no run configuration selects");
  static_assert(!Shadowed,
                "accel::configs<...>: an entry can never be chosen (its index is this template's first argument): an "
                "earlier entry has the same mixed_precision() and distributed_type() and fits at least the same "
                "processes and accumulation steps, so dispatch always builds that one; remove the entry, or make "
                "its policies differ in what selects them");
  static constexpr bool value = true;
};

/// Whether an entry before `Later` in `List` shadows it.
template <class List, std::size_t Later, std::size_t... Earlier>
constexpr bool shadowed_by_earlier(std::index_sequence<Earlier...>) {
  return (shadows<std::tuple_element_t<Earlier, List>, std::tuple_element_t<Later, List>>() || ... || false);
}

template <class... Accelerators, std::size_t... Index>
constexpr bool every_entry_reachable(std::index_sequence<Index...>) {
  using list = std::tuple<Accelerators...>;
  return (reachable_entry<Index, shadowed_by_earlier<list, Index>(std::make_index_sequence<Index>{}),
                          config_traits<std::tuple_element_t<Index, list>>::mixed_precision.empty()>::value &&
          ...);
}

/// The options with the run's accumulation steps filled in when they leave them open, so that
/// accumulate_dynamic uses a number that came from the config file (the environment variable wins anyway).
ACCEL_DECL options with_accumulation_steps(options opts, const run_config& config);

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
  static_assert(every_entry_reachable<Accelerators...>(std::index_sequence_for<Accelerators...>{}));
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
        ", processes=" + std::to_string(config.num_processes) +
        (config.distributed_type.empty() ? "" : ", distributed_type=" + config.distributed_type) +
        "; the program was compiled with:" + compiled);
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

#if ACCEL_HEADER_ONLY
#include "impl/dispatch.ipp"
#endif
