/// \file
/// What a profile recorded, without LibTorch: `accel::profile_event` (one event of a window, what `prof.events()`
/// returns), and `accel::key_averages(events)` (torch.profiler's `prof.key_averages()`: the events aggregated per name,
/// their self and total times, calls, memory and FLOPs), whose `table(sort_by, row_limit)` is the text PyTorch's
/// `key_averages().table(...)` prints:
///
///     std::cout << prof.key_averages().table("self_cpu_time_total", 10);
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "detail/config.hpp"

namespace accel {

/// One event of a recorded window, as LibTorch's profiler saw it (its `KinetoEvent`, in a form that does not change
/// with the LibTorch version).
struct profile_event {
  /// The operator (`aten::addmm`), autograd node, `ProfilerStep#N` mark or `[memory]` event.
  std::string name = {};
  /// Its kind, as the Chrome trace calls it: "cpu_op", "user_annotation" (a `ProfilerStep#N` mark or another
  /// user scope), "cpu_instant_event" (`[memory]`) or "kernel" (a device's).
  std::string category = {};
  /// When it started (the profiler's clock) and how long it took, in nanoseconds (0 for `[memory]`).
  std::int64_t start_ns = 0;
  std::int64_t duration_ns = 0;
  /// LibTorch's number of the thread it ran on.
  std::uint64_t thread = 0;
  /// One shape per input (empty for a non-tensor input); nothing without `record_shapes`.
  std::vector<std::vector<std::int64_t>> input_shapes = {};
  /// One dtype name per input ("float", "long int", "" for a non-tensor); nothing without `record_shapes`.
  std::vector<std::string> input_types = {};
  /// Estimated floating-point operations (`with_flops`; 0 for operators without a formula).
  std::uint64_t flops = 0;
  /// Bytes allocated (positive) or freed (negative) by a `[memory]` event (`profile_memory`).
  std::int64_t bytes = 0;
  /// The autograd sequence number linking a forward operator and its backward; -1 when none.
  std::int64_t sequence_nr = -1;
};

/// The events of one name (and input shapes, when grouped by them) together: torch.profiler's `FunctionEventAvg`.
struct profile_event_average {
  /// The events' name (`key` in PyTorch).
  std::string key = {};
  /// Their input shapes, when `key_averages` grouped by them; empty otherwise.
  std::vector<std::vector<std::int64_t>> input_shapes = {};
  /// How many there were ("# of Calls").
  std::int64_t count = 0;
  /// Their durations added up, what they called included ("CPU total").
  std::int64_t cpu_time_total_ns = 0;
  /// The same less the time of the events nested in them on their thread ("Self CPU").
  std::int64_t self_cpu_time_total_ns = 0;
  /// Bytes allocated less bytes freed during them, what they called included (`[memory]` events: `profile_memory`).
  std::int64_t cpu_memory_usage = 0;
  /// The same less what the events nested in them allocated.
  std::int64_t self_cpu_memory_usage = 0;
  /// Their FLOPs added up (`with_flops`).
  std::uint64_t flops = 0;

  /// The average duration ("CPU time avg").
  [[nodiscard]] std::int64_t cpu_time_ns() const noexcept { return count == 0 ? 0 : cpu_time_total_ns / count; }
};

/// What `key_averages` returns: one `profile_event_average` per name, in the order the names first occur, and their
/// table.
class profile_averages {
 public:
  profile_averages(std::vector<profile_event_average> rows, bool by_input_shape)
      : rows_(std::move(rows)), by_input_shape_(by_input_shape) {}

  [[nodiscard]] auto begin() const noexcept { return rows_.begin(); }
  [[nodiscard]] auto end() const noexcept { return rows_.end(); }
  [[nodiscard]] std::size_t size() const noexcept { return rows_.size(); }
  [[nodiscard]] const profile_event_average& operator[](std::size_t i) const { return rows_[i]; }
  /// The row of `key` (the first, when grouped by input shapes); throws `std::out_of_range` when there is none.
  [[nodiscard]] ACCEL_DECL const profile_event_average& at(std::string_view key) const;

  /// The rows as torch.profiler's `table()` prints them: Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time
  /// avg, (CPU Mem, Self CPU Mem with memory events), # of Calls, (Input Shapes when grouped by them), (Total MFLOPs
  /// with FLOPs), then `Self CPU time total`. `sort_by`: "" (the order of first occurrence), or largest first by
  /// "cpu_time_total", "self_cpu_time_total", "cpu_time", "count", "cpu_memory_usage", "self_cpu_memory_usage" or
  /// "flops" (anything else throws `std::invalid_argument`); at most `row_limit` rows (-1: all).
  [[nodiscard]] ACCEL_DECL std::string table(std::string_view sort_by = "", int row_limit = 100) const;

 private:
  std::vector<profile_event_average> rows_;
  bool by_input_shape_;
};

namespace detail {

/// What an event adds to its row once the events nested in it are known.
struct event_totals {
  std::int64_t children_ns = 0;
  std::int64_t memory = 0;
  std::int64_t children_memory = 0;
};

/// Whether `inner` lies within `outer` on the timeline (a `[memory]` event has no duration: its instant does).
ACCEL_DECL bool contains(const profile_event& outer, const profile_event& inner) noexcept;

inline bool is_memory_event(const profile_event& event) noexcept { return event.category == "cpu_instant_event"; }

/// For each event, the time of the events directly nested in it on its thread, and the bytes allocated during it
/// (its own and its nested events'): a walk in start order with a stack of the events still open. Time that two
/// nested events share counts once: LibTorch 1.13 rounds each start and duration to microseconds, so that one event
/// can begin a microsecond before the one beside it ends, and the parent's self time must not go below zero.
ACCEL_DECL std::vector<event_totals> nested_totals(const std::vector<profile_event>& events);

/// `nanoseconds` as torch.profiler prints a time: "12.345us", "1.234ms" or "2.000s".
ACCEL_DECL std::string profile_time(std::int64_t nanoseconds);

/// `bytes` as torch.profiler prints memory: "1.50 Mb", "12.00 Kb", "-8 b".
ACCEL_DECL std::string profile_memory(std::int64_t bytes);

ACCEL_DECL std::string profile_percent(std::int64_t part, std::int64_t whole);

ACCEL_DECL std::string profile_shapes(const std::vector<std::vector<std::int64_t>>& shapes);

/// The value `table` sorts by, named as torch.profiler's `sort_by`.
ACCEL_DECL double profile_sort_value(const profile_event_average& row, std::string_view sort_by);

/// The table's text: columns right-aligned, two spaces apart, a dashed line above and below the header and below
/// the rows, as torch.profiler lays it out.
ACCEL_DECL std::string profile_table_text(const std::vector<std::vector<std::string>>& cells, std::string_view footer);

}  // namespace detail

/// torch.profiler's `key_averages()` over `events` (a profiler's `events()`): one row per name (and per input shapes
/// with `group_by_input_shape`, which needs `record_shapes`), in the order the names first occur. An event's self time
/// is its duration less that of the events nested in it on its thread; `[memory]` events are no rows of their own:
/// their bytes count for the events they occur in. A device's kernels are rows of their own, their times their own.
/// A function object: argument-dependent lookup finds no object, so a program's own `key_averages(events)` called
/// unqualified with accel's events stays its own (and unambiguous).
struct key_averages_function {
  [[nodiscard]] ACCEL_DECL profile_averages operator()(const std::vector<profile_event>& events,
                                                       bool group_by_input_shape = false) const;
};
inline constexpr key_averages_function key_averages{};

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/profile_events.ipp"
#endif
