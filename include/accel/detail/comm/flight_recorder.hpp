/// \file
/// The flight recorder (PyTorch's, for accel's Gloo communicator): each process keeps its last N collectives in a
/// ring (N = ACCEL_FLIGHT_RECORDER_ENTRIES, 2,000 by default, 0 turns it off), with the process group, the group's
/// sequence number, the operation, sizes, dtypes, state and times, and the accel call that issued it (a
/// thread-local label set by `collective_caller`). `dump_flight_record` writes it in PyTorch's dump format (a pickled
/// dict, `accel_trace_rank_{rank}` in ACCEL_FLIGHT_RECORDER_DIR), which `torchfrtrace` and `accel fr-trace` read.
/// The hang watch (`hang_watch`) is a thread that notices a collective not completed within the hang timeout. No
/// LibTorch here: the communicator turns its tensors into sizes and dtype names.
// IWYU pragma: private, include <accel/parallel.hpp>
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../config.hpp"
#include "../support/pickle_value.hpp"

namespace accel::detail {

/// Scheduled (handed to the backend), started (a process waits on it; Gloo has no start event), completed.
enum class collective_state { scheduled, started, completed };
[[nodiscard]] ACCEL_DECL const char* collective_state_name(collective_state state) noexcept;

/// One collective as the ring holds it: the slot's strings and vectors keep their capacity when it is reused.
struct flight_entry {
  std::uint64_t record_id = 0;
  std::string group;                    // the process group's name: "default", or a separate group's or subgroup's
  std::uint64_t collective_seq_id = 0;  // per group, counting collectives
  std::uint64_t p2p_seq_id = 0;         // per group, counting sends and receives
  bool is_p2p = false;
  std::string operation;  // PyTorch's profiling name without the backend: all_reduce, send 0->1
  std::vector<std::vector<std::int64_t>> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;
  collective_state state = collective_state::scheduled;
  std::int64_t time_created_ns = 0;
  std::int64_t time_started_ns = 0;    // 0: not yet
  std::int64_t time_completed_ns = 0;  // 0: not yet
  std::int64_t timeout_ms = 0;
  std::string issued_by;  // the accel call (`collective_caller`), or empty
};

/// A process group as the dump's pg_config describes it.
struct flight_group {
  std::string name;
  std::vector<int> ranks;  // the job's ranks of its members
};

/// What a collective passes in and gets out: each tensor's sizes and dtype name (PyTorch's: "Float").
struct collective_operands {
  std::vector<std::vector<std::int64_t>> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;
};

/// The ring of one process: a fixed vector of N entries under a mutex, overwritten oldest first.
class flight_recorder {
 public:
  /// The process's recorder, sized by ACCEL_FLIGHT_RECORDER_ENTRIES when first used.
  [[nodiscard]] ACCEL_DECL static flight_recorder& process();

  ACCEL_DECL explicit flight_recorder(std::size_t capacity);

  [[nodiscard]] bool enabled() const noexcept { return !ring_.empty(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return ring_.size(); }

  /// Names a process group of `ranks` (the job's ranks) for the dumps; for the job's group (`world_size` > 0), this
  /// process's rank in the job is `rank`.
  ACCEL_DECL void add_group(const std::string& name, std::vector<int> ranks, int rank, int world_size);

  /// Records a collective of `group`, scheduled now, issued by this thread's `collective_caller`; returns its
  /// record id, which `started` and `completed` take (0 when the recorder is off).
  ACCEL_DECL std::uint64_t record(const std::string& group, std::string_view operation, bool is_p2p,
                                  const collective_operands& operands, std::chrono::milliseconds timeout);
  ACCEL_DECL void started(std::uint64_t record_id);
  ACCEL_DECL void completed(std::uint64_t record_id);

  /// The entries still in the ring, oldest first.
  [[nodiscard]] ACCEL_DECL std::vector<flight_entry> entries() const;
  /// The oldest entry not completed, if any.
  [[nodiscard]] ACCEL_DECL std::optional<flight_entry> oldest_pending() const;
  [[nodiscard]] ACCEL_DECL std::vector<flight_group> groups() const;
  [[nodiscard]] int rank() const noexcept { return rank_; }

  /// The dump: PyTorch's dict (version, pg_config, pg_status, entries), with accel's `issued_by` in each entry.
  [[nodiscard]] ACCEL_DECL pickle_value dump() const;

 private:
  struct group_counters {
    std::uint64_t collectives = 0, p2p = 0;
  };
  [[nodiscard]] ACCEL_DECL flight_entry* slot_of(std::uint64_t record_id);

  mutable std::mutex mutex_;
  std::vector<flight_entry> ring_;
  std::uint64_t next_id_ = 0;
  std::vector<flight_group> groups_;
  std::vector<group_counters> counters_;  // beside groups_
  int rank_ = 0;
  int world_size_ = 1;
};

/// Labels the collectives this thread starts while it lives with the accel call that issues them (`backward`,
/// `save_state`). Nested scopes keep the outermost label: the call the user made. The label must outlive the scope
/// (a string literal).
class collective_caller {
 public:
  ACCEL_DECL explicit collective_caller(const char* call) noexcept;
  ACCEL_DECL ~collective_caller();
  collective_caller(const collective_caller&) = delete;
  collective_caller& operator=(const collective_caller&) = delete;

  /// This thread's label, or nullptr.
  [[nodiscard]] ACCEL_DECL static const char* current() noexcept;

 private:
  const char* previous_;
};

/// The directory dumps go to: ACCEL_FLIGHT_RECORDER_DIR, or none (no dump) when it is unset or empty.
[[nodiscard]] ACCEL_DECL std::optional<std::string> flight_record_directory();

/// Writes this process's record to `directory`/accel_trace_rank_{rank} (the directory made if need be; atomically,
/// through a file that holds no part of that name) and returns the file's path; the environment's directory by default.
/// Throws `std::runtime_error` when the file cannot be written, `std::invalid_argument` when no directory is set.
ACCEL_DECL std::string dump_flight_record(std::optional<std::string> directory = std::nullopt);

/// The exit status of a process the hang watch ends.
inline constexpr int hang_exit_status = 86;

/// The hang timeout: ACCEL_HANG_TIMEOUT (seconds, 0 turns the watch off) when set, else `configured`.
[[nodiscard]] ACCEL_DECL std::chrono::milliseconds hang_timeout_from_environment(std::chrono::milliseconds configured);

/// How the hang watch of one process reaches the others: through the job's rendezvous store (the Gloo
/// communicator's), so that every process dumps when one notices a hang, the sleeping one included.
struct hang_watch_links {
  std::function<void()> request_dumps;    // tell every process to dump
  std::function<bool()> dumps_requested;  // whether some process asked
  std::function<void()> confirm_dump;     // this process has dumped
  std::function<std::int64_t()> dumped;   // how many have
  int world_size = 1;
};

/// A thread that checks the recorder every tenth of the hang timeout (at most every half second): a collective not
/// completed within `timeout` makes it ask every process to dump, dump this one's record, print which collective to
/// stderr and end the process with `hang_exit_status` once the others have dumped (or none has for 2 s: a vanished
/// machine never will; 5 s at most). Another process's request makes it dump and carry on (the launcher ends the
/// job). SIGUSR1 makes it dump too, where ACCEL_FLIGHT_RECORDER_DIR is set and the program had left the signal's
/// default action (which ends the process).
class hang_watch {
 public:
  ACCEL_DECL hang_watch(flight_recorder& recorder, std::chrono::milliseconds timeout, hang_watch_links links);
  ACCEL_DECL ~hang_watch();
  hang_watch(const hang_watch&) = delete;
  hang_watch& operator=(const hang_watch&) = delete;

 private:
  ACCEL_DECL void run(const std::stop_token& stop);
  [[noreturn]] ACCEL_DECL void end_hung(const flight_entry& stuck);
  /// Dumps where the environment says, once; the message to print.
  ACCEL_DECL std::string dump_once();
  /// Dumps again on each SIGUSR1 (when ACCEL_FLIGHT_RECORDER_DIR is set and the signal had no handler).
  ACCEL_DECL void dump_on_signal();

  flight_recorder& recorder_;
  std::chrono::milliseconds timeout_;
  hang_watch_links links_;
  bool dumped_ = false;
  bool handles_signal_ = false;  // SIGUSR1's handler is this watch's
  std::jthread thread_;          // last: started once the members above are
};

/// The sentence naming a collective: "collective 17 (all_reduce) on group default, issued by backward".
[[nodiscard]] ACCEL_DECL std::string describe_collective(const flight_entry& entry);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/flight_recorder.ipp"
#endif
