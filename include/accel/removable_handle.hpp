/// \file
/// `removable_handle`, what registering a hook returns (PyTorch's `RemovableHandle`): `remove()` unregisters the hook,
/// destroying the handle does not. `detail::hook_list`: the hooks of one kind, run in registration order.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace accel {

namespace detail {
template <class Hook>
class hook_list;
}  // namespace detail

/// Unregisters the hook it was returned for. Copies remove the same hook; removing twice, or after the accelerator is
/// gone, does nothing.
class removable_handle {
 public:
  removable_handle() = default;

  /// Unregisters the hook: later saves or loads no longer call it.
  void remove() {
    if (auto unregister = std::exchange(remove_, {})) unregister();
  }

 private:
  template <class Hook>
  friend class detail::hook_list;
  explicit removable_handle(std::function<void()> remove) : remove_(std::move(remove)) {}

  std::function<void()> remove_;
};

namespace detail {

/// Hooks of one kind (`Hook`, a `std::function`), kept by id: the handles refer to the list weakly, so that a handle
/// may outlive it.
template <class Hook>
class hook_list {
 public:
  /// Registers `hook` after the others; `what` names the registering call in the error for an empty function.
  removable_handle add(Hook hook, const char* what) {
    if (!hook) throw std::invalid_argument(std::string(what) + ": the hook is an empty function; pass a callable");
    const auto id = next_id_++;
    hooks_->emplace(id, std::move(hook));
    return removable_handle([list = std::weak_ptr<hooks>(hooks_), id] {
      if (const auto alive = list.lock()) alive->erase(id);
    });
  }

  /// Calls every hook with `args`, in registration order. On a copy of the list, so that a hook may remove a hook.
  template <class... Args>
  void run(Args&... args) const {
    const auto snapshot = *hooks_;
    for (const auto& [id, hook] : snapshot) hook(args...);
  }

  [[nodiscard]] bool empty() const noexcept { return hooks_->empty(); }

 private:
  using hooks = std::map<std::uint64_t, Hook>;
  std::shared_ptr<hooks> hooks_ = std::make_shared<hooks>();
  std::uint64_t next_id_ = 0;
};

}  // namespace detail
}  // namespace accel
