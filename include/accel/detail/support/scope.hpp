/// \file
/// Scope guards: the RAII scopes of the public API (`no_sync`, `main_process_first`, ...) are built from them.
// IWYU pragma: private, include <accel/accel.hpp>
#pragma once

#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

namespace accel::detail {

/// A scope with nothing to do (fp32's forward, `accumulate` without accumulation): an empty object the optimiser
/// removes. Its destructor is user-provided so that `auto scope = acc.accumulate(model);` in code generic over the
/// accumulation policy is not "set but not used" to GCC's -Wall.
struct no_scope {
  constexpr no_scope() = default;
  no_scope(const no_scope&) = default;
  no_scope& operator=(const no_scope&) = default;
  constexpr ~no_scope() {}  // NOLINT(modernize-use-equals-default): = default would make it trivial again
};

/// Runs `action` when the scope ends, however it ends (restoring a flag).
template <class Action>
class [[nodiscard]] scope_exit {
 public:
  explicit scope_exit(Action action) : action_(std::move(action)) {}
  scope_exit(const scope_exit&) = delete;
  scope_exit& operator=(const scope_exit&) = delete;
  ~scope_exit() { action_(); }

 private:
  Action action_;
};

/// Runs `action` when the scope ends normally, not when an exception leaves it: the action may be a collective
/// (a barrier), and a process unwinding from an error must not wait for the others there. It may throw.
template <class Action>
class [[nodiscard]] scope_success {
 public:
  explicit scope_success(Action action) : action_(std::move(action)) {}
  scope_success(const scope_success&) = delete;
  scope_success& operator=(const scope_success&) = delete;
  ~scope_success() noexcept(false) {
    if (std::uncaught_exceptions() == uncaught_) action_();
  }

 private:
  Action action_;
  int uncaught_ = std::uncaught_exceptions();
};

/// Runs `on_success` when the scope ends normally (it may throw, and may be a collective), `on_failure` when an
/// exception leaves it (it must not throw): a scope whose normal end communicates and whose failure only tidies up.
template <class OnSuccess, class OnFailure>
class [[nodiscard]] scope_end {
 public:
  scope_end(OnSuccess on_success, OnFailure on_failure)
      : on_success_(std::move(on_success)), on_failure_(std::move(on_failure)) {}
  scope_end(const scope_end&) = delete;
  scope_end& operator=(const scope_end&) = delete;
  ~scope_end() noexcept(false) {
    if (std::uncaught_exceptions() == uncaught_)
      on_success_();
    else
      on_failure_();
  }

 private:
  OnSuccess on_success_;
  OnFailure on_failure_;
  int uncaught_ = std::uncaught_exceptions();
};

/// Runs `action` only when an exception leaves the scope: clean-up that a success must not do. It must not throw.
template <class Action>
class [[nodiscard]] scope_fail {
 public:
  explicit scope_fail(Action action) : action_(std::move(action)) {}
  scope_fail(const scope_fail&) = delete;
  scope_fail& operator=(const scope_fail&) = delete;
  ~scope_fail() {
    if (std::uncaught_exceptions() > uncaught_) action_();
  }

 private:
  Action action_;
  int uncaught_ = std::uncaught_exceptions();
};

/// Waits for every process before the scope when not `first`, after it when `first`: the first ones go ahead alone
/// (`main_process_first`).
template <class Parallel>
auto first_then_others(Parallel& parallel, bool first) {
  if (!first) parallel.wait_for_everyone();
  return scope_success([&parallel, first] {
    if (first) parallel.wait_for_everyone();
  });
}

/// Runs `action` when `here`, and returns its result in an optional (nothing for a void action): `on_main_process`.
template <class Action>
auto run_if(bool here, Action&& action) {
  using result = std::invoke_result_t<Action>;
  if constexpr (std::is_void_v<result>) {
    if (here) std::forward<Action>(action)();
  } else {
    using value = std::remove_cvref_t<result>;
    return here ? std::optional<value>(std::forward<Action>(action)()) : std::nullopt;
  }
}

}  // namespace accel::detail
