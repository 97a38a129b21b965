/// \file
/// `accel::make_pipeline_schedule`: the order in which each process of a pipeline runs its stages' forwards and
/// backwards and sends and receives their activations and gradients (GPipe, 1F1B, interleaved 1F1B, ZB-H1), and
/// `accel::simulate_pipeline`, which runs such lists on a model of the processes to check that they complete and to
/// measure their bubble. Plain C++, no LibTorch: the executor runs the lists over Gloo. Placement rule: stages are
/// looped over the processes, stage s on process s % processes, so a process holds stages r, r + p, r + 2p, ...
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "detail/config.hpp"

namespace accel {

/// The pipeline schedules (PyTorch's torch.distributed.pipelining names in brackets).
enum class pipeline_schedule {
  gpipe,             ///< all forwards, then all backwards (ScheduleGPipe; with several stages per process: LoopedBFS)
  one_f_one_b,       ///< 1F1B (Schedule1F1B): one stage per process
  interleaved_1f1b,  ///< interleaved 1F1B (ScheduleInterleaved1F1B): several stages per process, looped placement
  zero_bubble        ///< ZB-H1: backward split into input gradient and weight gradient (one stage per process)
};

/// stages are placed looped: stage s runs on process s % processes.
struct pipeline_shape {
  int stages = 1;  ///< a multiple of processes
  int micro_batches = 1;
  int processes = 1;
  [[nodiscard]] int stages_per_process() const { return stages / processes; }
  [[nodiscard]] int process_of(int stage) const { return stage % processes; }
};

/// What one action does. A send or receive names the stage of the process that runs it: receive_activation(s, mb)
/// takes what send_activation(s - 1, mb) sent, receive_gradient(s, mb) what send_gradient(s + 1, mb) sent.
enum class pipeline_op : std::uint8_t {
  forward,
  backward,
  backward_input,
  backward_weight,
  send_activation,
  receive_activation,
  send_gradient,
  receive_gradient
};

struct pipeline_action {
  pipeline_op op = pipeline_op::forward;
  int stage = 0;
  int micro_batch = 0;
  friend bool operator==(const pipeline_action&, const pipeline_action&) = default;
};

/// "F2.3" style text: op letter(s) (F, B, I, W, SA, RA, SG, RG), stage, '.', micro-batch.
ACCEL_DECL std::ostream& operator<<(std::ostream& out, const pipeline_action& action);

/// Every process's actions in the order it runs them; every process computes the same lists.
///   - gpipe: every forward of the process's first stage (micro-batches in order), then of its next, ...; then the
///     backwards, its last stage first. Holds m micro-batches per stage at its peak.
///   - one_f_one_b: min(p - 1 - r, m) warm-up forwards on process r, then a forward and a backward in turn, then the
///     cool-down backwards; process r holds at most min(p - r, m).
///   - interleaved_1f1b: the micro-batches in rounds of at least p (k = max(1, m / p) rounds of m / k, the first m % k
///     of them one larger; one round of all when m < p); each round passes through the process's stages in
///     turn, the backwards through them in reverse. (v - 1) * (first round) + 2 (p - 1 - r) warm-up forwards, then a
///     forward and a backward in turn. With one stage per process it is one_f_one_b.
///   - zero_bubble (ZB-H1): one_f_one_b's order with each backward an input gradient, and process r keeps up to r
///     weight gradients pending, run when it would otherwise wait and at the end. Counting a micro-batch as held
///     until its weight gradient, every process then holds min(p, m): 1F1B's peak over the pipeline (process 0's),
///     as the paper says, but more than 1F1B's min(p - r, m) on process r > 0. No order does better on both: to end
///     at 3m + p - 1, the last process must still have p weight gradients pending when it runs its last input
///     gradient.
/// Throws std::invalid_argument naming the problem and the fix for a bad shape (stages not a multiple of
/// processes, < 1 anything, one_f_one_b / zero_bubble with more than one stage per process: "use interleaved_1f1b").
/// Each receive comes immediately before the compute action that needs it, each send immediately after the one that
/// produces it; a hand-off between two stages of one process has no send or receive. From one process to another,
/// the activations are received in the order they are sent, and so are the gradients; the two kinds together may
/// cross (interleaved 1F1B on 2 processes with an odd m >= 5), so an executor keeps them apart (a tag per kind, or
/// per stage and micro-batch).
ACCEL_DECL std::vector<std::vector<pipeline_action>> make_pipeline_schedule(pipeline_schedule schedule,
                                                                            pipeline_shape shape);

/// Each compute action's time; a backward takes backward_input + backward_weight.
struct pipeline_costs {
  double forward = 1, backward_input = 1, backward_weight = 1;
};  ///< backward = input + weight

struct pipeline_simulation {
  bool completes = false;  ///< every action ran, every send met its receive
  std::string problem{};   ///< when not: which process waits at which action, or which rule broke
  double makespan = 0;
  double bubble = 0;                    ///< 1 - busy time / (processes * makespan)
  std::vector<int> peak_activations{};  ///< per process: most micro-batch activations held at once
};

/// Runs the lists on a model of the processes: compute actions take their cost, sends are issued at once without
/// waiting, a receive waits for its send (it ends at the later of the two processes' times). It stops at the first
/// broken rule (an action for another process's stage or out of range, a second forward or backward, a backward
/// before its forward or before the backward of the next stage on the same process, a weight gradient before its
/// input gradient, a forward or backward without the receive that brings its input, a send before its data or
/// between stages of one process), at a deadlock (naming each waiting process, its action's index and the action),
/// or at the end with an action missing or a send that nobody receives. Throws std::invalid_argument for a bad shape,
/// as make_pipeline_schedule.
ACCEL_DECL pipeline_simulation simulate_pipeline(const std::vector<std::vector<pipeline_action>>& actions,
                                                 pipeline_shape shape, pipeline_costs costs = {});

/// The same with each process at its own costs (`costs_per_process[r]` for process r), as measured stages are: a
/// process a few percent slower than its peers makes them wait for it every round, which at a small bubble (zero
/// bubble's) outweighs the schedule's own. Throws std::invalid_argument unless there is one per process.
ACCEL_DECL pipeline_simulation simulate_pipeline(const std::vector<std::vector<pipeline_action>>& actions,
                                                 pipeline_shape shape,
                                                 const std::vector<pipeline_costs>& costs_per_process);

/// The schedule's bubble fraction in closed form, for equal stage costs (forward 1, backward_input 1,
/// backward_weight 1); the fraction does not change when every cost is scaled alike. It is what simulate_pipeline
/// measures at every shape (the tests check p 1..8, m 1..16, 1..4 stages per process):
///   - gpipe, one_f_one_b, interleaved_1f1b: 1 - v m / (v max(m, p) + min(m, p) - 1), the textbook (p - 1) /
///     (v m + p - 1) when m >= p, and GPipe's and 1F1B's (p - 1) / (m + p - 1) for every m when v = 1;
///   - zero_bubble: ZB-H1's (p - 1) / (3m + p - 1) when m >= p; 1 - 3m / (2m + 2p - 1) when m < p.
/// At unequal costs the first three do not change; zero bubble's idle time per process is ZB-H1's (p - 1)(F + B - W)
/// when m >= p and a weight part costs no more than a forward or an input part (the simulator's; pp.schedule checks).
ACCEL_DECL double pipeline_bubble_formula(pipeline_schedule schedule, pipeline_shape shape);

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/pipeline_schedule.ipp"
#endif
