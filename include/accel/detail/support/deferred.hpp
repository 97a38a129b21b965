/// \file
/// `deferred_t<T, Dependent>`: `T`, named so that a template needs it complete only where it is instantiated. The
/// accelerator reaches its services (trackers, the profiler, progress bars) this way: their headers are included by
/// the files that use them, not by every file that includes accelerator.hpp.
// IWYU pragma: private, include <accel/accelerator.hpp>
#pragma once

namespace accel::detail {

class tracker_set;     // tracking.hpp
struct progress_bars;  // progress.hpp

template <class T, class Dependent>
struct deferred {
  using type = T;
};
template <class T, class Dependent>
using deferred_t = typename deferred<T, Dependent>::type;

/// Whether `T` is complete here: for a static_assert that names the header to include.
template <class T>
concept is_complete = requires { sizeof(T); };

}  // namespace accel::detail
