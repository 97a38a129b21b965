/// \file
/// What pipeline_schedule.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION. The schedules are built as each process's order of compute
/// actions (forwards and backwards), to which the sends and receives are then added where a neighbouring stage is on
/// another process; the simulator checks every rule as it runs the lists.
#pragma once

#include "../pipeline_schedule.hpp"

#include <algorithm>
#include <cstddef>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel::detail::pp {

using action_lists = std::vector<std::vector<pipeline_action>>;

ACCEL_DECL std::string text(const pipeline_action& action) {
  std::ostringstream out;
  out << action;
  return out.str();
}

ACCEL_DECL const char* schedule_name(pipeline_schedule schedule) {
  switch (schedule) {
    case pipeline_schedule::gpipe:
      return "gpipe";
    case pipeline_schedule::one_f_one_b:
      return "one_f_one_b";
    case pipeline_schedule::interleaved_1f1b:
      return "interleaved_1f1b";
    case pipeline_schedule::zero_bubble:
      return "zero_bubble";
  }
  return "an unknown pipeline_schedule";
}

/// The checks every schedule and the simulator share: each size at least 1, stages a multiple of processes.
ACCEL_DECL void check_shape(const pipeline_shape& shape, const std::string& who) {
  const auto at_least_one = [&](int value, const char* name) {
    if (value < 1)
      throw std::invalid_argument(who + ": " + name + " is " + std::to_string(value) + "; give at least 1");
  };
  at_least_one(shape.stages, "stages");
  at_least_one(shape.micro_batches, "micro_batches");
  at_least_one(shape.processes, "processes");
  if (shape.stages % shape.processes != 0)
    throw std::invalid_argument(who + ": stages (" + std::to_string(shape.stages) +
                                ") is not a multiple of processes (" + std::to_string(shape.processes) + "); use " +
                                std::to_string(shape.stages / shape.processes * shape.processes + shape.processes) +
                                " stages, or a number of processes that divides " + std::to_string(shape.stages));
}

ACCEL_DECL void check_schedule_shape(pipeline_schedule schedule, const pipeline_shape& shape, const std::string& who) {
  check_shape(shape, who);
  const bool one_stage_each = schedule == pipeline_schedule::one_f_one_b || schedule == pipeline_schedule::zero_bubble;
  if (one_stage_each && shape.stages_per_process() > 1)
    throw std::invalid_argument(who + ": " + schedule_name(schedule) + " runs one stage per process, and " +
                                std::to_string(shape.stages) + " stages over " + std::to_string(shape.processes) +
                                " processes is " + std::to_string(shape.stages_per_process()) +
                                " per process; use interleaved_1f1b (or gpipe) for several stages per process, or as "
                                "many processes as stages");
  if (!one_stage_each && schedule != pipeline_schedule::gpipe && schedule != pipeline_schedule::interleaved_1f1b)
    throw std::invalid_argument(who + ": pipeline_schedule " + std::to_string(static_cast<int>(schedule)) +
                                " is none of gpipe, one_f_one_b, interleaved_1f1b, zero_bubble");
}

/// GPipe, looped when a process holds several stages (PyTorch's LoopedBFS): every forward of its first stage, then
/// of its next, ...; then the backwards, last stage first. Micro-batches in order in both.
ACCEL_DECL std::vector<pipeline_action> gpipe_order(const pipeline_shape& shape, int process) {
  std::vector<pipeline_action> order;
  const int local = shape.stages_per_process();
  for (int chunk = 0; chunk < local; ++chunk)
    for (int mb = 0; mb < shape.micro_batches; ++mb)
      order.push_back({pipeline_op::forward, process + chunk * shape.processes, mb});
  for (int chunk = local - 1; chunk >= 0; --chunk)
    for (int mb = 0; mb < shape.micro_batches; ++mb)
      order.push_back({pipeline_op::backward, process + chunk * shape.processes, mb});
  return order;
}

/// 1F1B on one stage per process: p - 1 - r warm-up forwards, then a forward and a backward in turn, then the
/// cool-down backwards. With `split` (ZB-H1), each backward is an input gradient, and process r keeps up to r weight
/// gradients pending: putting them off, the later processes return their input gradients sooner, so the gradients
/// reach process 0 sooner, and the pending weight gradients fill what was 1F1B's cool-down bubble.
ACCEL_DECL std::vector<pipeline_action> one_f_one_b_order(const pipeline_shape& shape, int process, bool split) {
  std::vector<pipeline_action> order;
  const int m = shape.micro_batches;
  const int warm_up = std::min(shape.processes - 1 - process, m);
  const int deferred = split ? process : 0;
  for (int mb = 0; mb < warm_up; ++mb) order.push_back({pipeline_op::forward, process, mb});
  int oldest_pending = 0;
  for (int mb = 0; mb < m; ++mb) {
    if (warm_up + mb < m) order.push_back({pipeline_op::forward, process, warm_up + mb});
    if (!split) {
      order.push_back({pipeline_op::backward, process, mb});
      continue;
    }
    order.push_back({pipeline_op::backward_input, process, mb});
    for (; mb + 1 - oldest_pending > deferred; ++oldest_pending)
      order.push_back({pipeline_op::backward_weight, process, oldest_pending});
  }
  for (; split && oldest_pending < m; ++oldest_pending)
    order.push_back({pipeline_op::backward_weight, process, oldest_pending});
  return order;
}

/// The micro-batches in max(1, m / p) rounds, so of at least p each unless m < p. PyTorch's ScheduleInterleaved1F1B
/// refuses an m that its rounds do not divide; here the first m % rounds rounds take one more.
ACCEL_DECL std::vector<int> interleaved_rounds(const pipeline_shape& shape) {
  const int m = shape.micro_batches;
  const int count = std::max(1, m / shape.processes);
  std::vector<int> sizes(static_cast<std::size_t>(count), m / count);
  for (int extra = 0; extra < m % count; ++extra) ++sizes[static_cast<std::size_t>(extra)];
  return sizes;
}

/// The order in which a process of interleaved 1F1B meets its forwards (or backwards: chunks in reverse): round by
/// round, each of its stages in turn runs the round's micro-batches.
ACCEL_DECL std::vector<pipeline_action> interleaved_sequence(const pipeline_shape& shape, int process, bool backward) {
  std::vector<pipeline_action> sequence;
  const int local = shape.stages_per_process();
  int first = 0;
  for (const int size : interleaved_rounds(shape)) {
    for (int step = 0; step < local; ++step) {
      const int chunk = backward ? local - 1 - step : step;
      for (int mb = first; mb < first + size; ++mb)
        sequence.push_back(
            {backward ? pipeline_op::backward : pipeline_op::forward, process + chunk * shape.processes, mb});
    }
    first += size;
  }
  return sequence;
}

/// Interleaved 1F1B (Megatron-LM's, PyTorch's ScheduleInterleaved1F1B): (v - 1) * (first round) + 2 (p - 1 - r)
/// warm-up forwards, then a forward and a backward in turn, then the remaining backwards. One stage per process is
/// plain 1F1B.
ACCEL_DECL std::vector<pipeline_action> interleaved_order(const pipeline_shape& shape, int process) {
  if (shape.stages_per_process() == 1) return one_f_one_b_order(shape, process, false);
  const auto forwards = interleaved_sequence(shape, process, false);
  const auto backwards = interleaved_sequence(shape, process, true);
  const int total = static_cast<int>(forwards.size());
  const int warm_up = std::min(total, (shape.stages_per_process() - 1) * interleaved_rounds(shape).front() +
                                          2 * (shape.processes - 1 - process));
  std::vector<pipeline_action> order(forwards.begin(), forwards.begin() + warm_up);
  for (int step = 0; step < total; ++step) {
    if (warm_up + step < total) order.push_back(forwards[static_cast<std::size_t>(warm_up + step)]);
    order.push_back(backwards[static_cast<std::size_t>(step)]);
  }
  return order;
}

/// Adds the sends and receives to a process's compute order: a receive just before the compute action that needs
/// what comes from another process, a send just after the one that produces what another process needs.
ACCEL_DECL std::vector<pipeline_action> with_communication(const std::vector<pipeline_action>& order,
                                                           const pipeline_shape& shape, int process) {
  std::vector<pipeline_action> actions;
  const auto remote = [&](int stage) {
    return stage >= 0 && stage < shape.stages && shape.process_of(stage) != process;
  };
  for (const auto& action : order) {
    const bool forward = action.op == pipeline_op::forward;
    const bool gradient_out = action.op == pipeline_op::backward || action.op == pipeline_op::backward_input;
    if (forward && remote(action.stage - 1))
      actions.push_back({pipeline_op::receive_activation, action.stage, action.micro_batch});
    if (gradient_out && remote(action.stage + 1))
      actions.push_back({pipeline_op::receive_gradient, action.stage, action.micro_batch});
    actions.push_back(action);
    if (forward && remote(action.stage + 1))
      actions.push_back({pipeline_op::send_activation, action.stage, action.micro_batch});
    if (gradient_out && remote(action.stage - 1))
      actions.push_back({pipeline_op::send_gradient, action.stage, action.micro_batch});
  }
  return actions;
}

/// The simulator's record of one run: each process's place and clock, and what has happened to each (stage,
/// micro-batch), indexed stage * micro_batches + micro_batch.
struct simulation_run {
  const action_lists& actions;
  pipeline_shape shape;
  const std::vector<pipeline_costs>& costs;  // per process
  std::vector<std::size_t> next = std::vector<std::size_t>(static_cast<std::size_t>(shape.processes), 0);
  std::vector<double> clock = std::vector<double>(static_cast<std::size_t>(shape.processes), 0.0);
  std::vector<int> held = std::vector<int>(static_cast<std::size_t>(shape.processes), 0);
  std::vector<int> peak = std::vector<int>(static_cast<std::size_t>(shape.processes), 0);
  std::size_t cells = static_cast<std::size_t>(shape.stages) * static_cast<std::size_t>(shape.micro_batches);
  std::vector<char> forwarded = std::vector<char>(cells, 0), input_done = std::vector<char>(cells, 0);
  std::vector<char> whole_backward = std::vector<char>(cells, 0), weight_done = std::vector<char>(cells, 0);
  std::vector<char> got_activation = std::vector<char>(cells, 0), got_gradient = std::vector<char>(cells, 0);
  std::vector<double> activation_sent = std::vector<double>(cells, -1.0);
  std::vector<double> gradient_sent = std::vector<double>(cells, -1.0);
  double busy = 0;
  std::string problem{};

  [[nodiscard]] std::size_t cell(int stage, int mb) const {
    return static_cast<std::size_t>(stage) * static_cast<std::size_t>(shape.micro_batches) +
           static_cast<std::size_t>(mb);
  }
  [[nodiscard]] const pipeline_costs& costs_of(int process) const { return costs[static_cast<std::size_t>(process)]; }
  [[nodiscard]] bool remote(int process, int stage) const {
    return stage >= 0 && stage < shape.stages && shape.process_of(stage) != process;
  }
};

enum class step_result { ran, blocked, broke };

ACCEL_DECL step_result rule_broken(simulation_run& run, int process, const std::string& why) {
  const auto& action = run.actions[static_cast<std::size_t>(process)][run.next[static_cast<std::size_t>(process)]];
  run.problem = "process " + std::to_string(process) + ", action " +
                std::to_string(run.next[static_cast<std::size_t>(process)]) + " (" + text(action) + "): " + why;
  return step_result::broke;
}

ACCEL_DECL void compute(simulation_run& run, int process, double cost) {
  run.clock[static_cast<std::size_t>(process)] += cost;
  run.busy += cost;
}

/// A forward: the activation of the stage before must be here, from this process's own forward of it or received.
ACCEL_DECL step_result run_forward(simulation_run& run, int process, const pipeline_action& a) {
  const auto here = run.cell(a.stage, a.micro_batch);
  if (run.forwarded[here] != 0) return rule_broken(run, process, "a second forward of this micro-batch");
  if (a.stage > 0 && !run.remote(process, a.stage - 1) && run.forwarded[run.cell(a.stage - 1, a.micro_batch)] == 0)
    return rule_broken(run, process,
                       "runs before the forward of stage " + std::to_string(a.stage - 1) +
                           " on the same process, whose output it takes");
  if (run.remote(process, a.stage - 1) && run.got_activation[here] == 0)
    return rule_broken(run, process,
                       "waits forever for its input: no receive_activation (RA" + std::to_string(a.stage) + "." +
                           std::to_string(a.micro_batch) + ") before it");
  run.forwarded[here] = 1;
  auto& held = run.held[static_cast<std::size_t>(process)];
  run.peak[static_cast<std::size_t>(process)] = std::max(run.peak[static_cast<std::size_t>(process)], ++held);
  compute(run, process, run.costs_of(process).forward);
  return step_result::ran;
}

/// A backward or input gradient: its forward done, and the gradient of its output from the loss (last stage), from
/// this process's own backward of the next stage, or received.
ACCEL_DECL step_result run_backward(simulation_run& run, int process, const pipeline_action& a) {
  const auto here = run.cell(a.stage, a.micro_batch);
  const bool whole = a.op == pipeline_op::backward;
  if (run.forwarded[here] == 0) return rule_broken(run, process, "a backward before its forward");
  if (run.input_done[here] != 0) return rule_broken(run, process, "a second backward of this micro-batch");
  const int next = a.stage + 1;
  if (next < run.shape.stages && !run.remote(process, next) && run.input_done[run.cell(next, a.micro_batch)] == 0)
    return rule_broken(run, process,
                       "runs before the backward of stage " + std::to_string(next) +
                           " on the same process, whose input gradient it takes");
  if (run.remote(process, next) && run.got_gradient[here] == 0)
    return rule_broken(run, process,
                       "waits forever for its output's gradient: no receive_gradient (RG" + std::to_string(a.stage) +
                           "." + std::to_string(a.micro_batch) + ") before it");
  run.input_done[here] = 1;
  run.whole_backward[here] = whole ? 1 : 0;
  if (whole) --run.held[static_cast<std::size_t>(process)];
  const auto& costs = run.costs_of(process);
  compute(run, process, whole ? costs.backward_input + costs.backward_weight : costs.backward_input);
  return step_result::ran;
}

ACCEL_DECL step_result run_weight(simulation_run& run, int process, const pipeline_action& a) {
  const auto here = run.cell(a.stage, a.micro_batch);
  if (run.weight_done[here] != 0) return rule_broken(run, process, "a second weight gradient of this micro-batch");
  if (run.input_done[here] == 0 || run.whole_backward[here] != 0)
    return rule_broken(run, process, "a weight gradient before (or without) its backward_input");
  run.weight_done[here] = 1;
  --run.held[static_cast<std::size_t>(process)];
  compute(run, process, run.costs_of(process).backward_weight);
  return step_result::ran;
}

/// A send: to a stage on another process, of what this process has computed; issued at once, it waits for nothing.
ACCEL_DECL step_result run_send(simulation_run& run, int process, const pipeline_action& a) {
  const bool activation = a.op == pipeline_op::send_activation;
  const int to = activation ? a.stage + 1 : a.stage - 1;
  if (!run.remote(process, to))
    return rule_broken(run, process,
                       to < 0 || to >= run.shape.stages
                           ? "sends to stage " + std::to_string(to) + ", which does not exist"
                           : "sends to stage " + std::to_string(to) + " on the same process (a local hand-off)");
  const auto here = run.cell(a.stage, a.micro_batch);
  if ((activation ? run.forwarded[here] : run.input_done[here]) == 0)
    return rule_broken(
        run, process,
        activation ? "sends an activation before its forward ran" : "sends a gradient before its backward ran");
  auto& sent = activation ? run.activation_sent[here] : run.gradient_sent[here];
  if (sent >= 0) return rule_broken(run, process, "sends it a second time");
  sent = run.clock[static_cast<std::size_t>(process)];
  return step_result::ran;
}

/// A receive: from a stage on another process; it waits until the matching send has been issued.
ACCEL_DECL step_result run_receive(simulation_run& run, int process, const pipeline_action& a) {
  const bool activation = a.op == pipeline_op::receive_activation;
  const int from = activation ? a.stage - 1 : a.stage + 1;
  if (!run.remote(process, from))
    return rule_broken(run, process,
                       from < 0 || from >= run.shape.stages
                           ? "receives from stage " + std::to_string(from) + ", which does not exist"
                           : "receives from stage " + std::to_string(from) + " on the same process (a local hand-off)");
  const auto here = run.cell(a.stage, a.micro_batch);
  auto& got = activation ? run.got_activation[here] : run.got_gradient[here];
  if (got != 0) return rule_broken(run, process, "receives it a second time");
  const double sent = activation ? run.activation_sent[run.cell(from, a.micro_batch)]
                                 : run.gradient_sent[run.cell(from, a.micro_batch)];
  if (sent < 0) return step_result::blocked;
  got = 1;
  auto& clock = run.clock[static_cast<std::size_t>(process)];
  clock = std::max(clock, sent);
  return step_result::ran;
}

ACCEL_DECL step_result run_step(simulation_run& run, int process) {
  const auto& a = run.actions[static_cast<std::size_t>(process)][run.next[static_cast<std::size_t>(process)]];
  if (a.stage < 0 || a.stage >= run.shape.stages || a.micro_batch < 0 || a.micro_batch >= run.shape.micro_batches)
    return rule_broken(run, process,
                       "stage or micro-batch out of range (" + std::to_string(run.shape.stages) + " stages, " +
                           std::to_string(run.shape.micro_batches) + " micro-batches)");
  if (run.shape.process_of(a.stage) != process)
    return rule_broken(
        run, process,
        "stage " + std::to_string(a.stage) + " runs on process " + std::to_string(run.shape.process_of(a.stage)));
  switch (a.op) {
    case pipeline_op::forward:
      return run_forward(run, process, a);
    case pipeline_op::backward:
    case pipeline_op::backward_input:
      return run_backward(run, process, a);
    case pipeline_op::backward_weight:
      return run_weight(run, process, a);
    case pipeline_op::send_activation:
    case pipeline_op::send_gradient:
      return run_send(run, process, a);
    case pipeline_op::receive_activation:
    case pipeline_op::receive_gradient:
      return run_receive(run, process, a);
  }
  return rule_broken(run, process, "an unknown pipeline_op");
}

/// Runs every process as far as it can, again and again, until all are done, one breaks a rule, or none can move.
/// Returns false on a broken rule (run.problem says which).
ACCEL_DECL bool run_all(simulation_run& run) {
  for (bool moved = true; moved;) {
    moved = false;
    for (int process = 0; process < run.shape.processes; ++process) {
      const auto& list = run.actions[static_cast<std::size_t>(process)];
      auto& next = run.next[static_cast<std::size_t>(process)];
      while (next < list.size()) {
        const auto result = run_step(run, process);
        if (result == step_result::broke) return false;
        if (result == step_result::blocked) break;
        ++next;
        moved = true;
      }
    }
  }
  return true;
}

/// Every process still short of its end waits at a receive whose send never comes.
ACCEL_DECL std::string deadlock(const simulation_run& run) {
  std::string message;
  for (int process = 0; process < run.shape.processes; ++process) {
    const auto& list = run.actions[static_cast<std::size_t>(process)];
    const auto at = run.next[static_cast<std::size_t>(process)];
    if (at >= list.size()) continue;
    const auto& a = list[at];
    const bool activation = a.op == pipeline_op::receive_activation;
    const pipeline_action send{activation ? pipeline_op::send_activation : pipeline_op::send_gradient,
                               activation ? a.stage - 1 : a.stage + 1, a.micro_batch};
    message += (message.empty() ? "deadlock: " : "; ") + std::string("process ") + std::to_string(process) +
               " waits at action " + std::to_string(at) + " (" + text(a) + ") for " + text(send) + " from process " +
               std::to_string(run.shape.process_of(send.stage));
  }
  return message;
}

/// After a run with no process stuck: every micro-batch forwarded and backpropagated at every stage, every send met.
ACCEL_DECL std::string missing(const simulation_run& run) {
  for (int stage = 0; stage < run.shape.stages; ++stage)
    for (int mb = 0; mb < run.shape.micro_batches; ++mb) {
      const auto here = run.cell(stage, mb);
      const std::string where = " on process " + std::to_string(run.shape.process_of(stage));
      const auto name = [&](pipeline_op op) { return text({op, stage, mb}); };
      if (run.forwarded[here] == 0) return "missing: no forward " + name(pipeline_op::forward) + where;
      if (run.input_done[here] == 0)
        return "missing: no backward " + name(pipeline_op::backward) + " (or " + name(pipeline_op::backward_input) +
               ")" + where;
      if (run.whole_backward[here] == 0 && run.weight_done[here] == 0)
        return "missing: no weight gradient " + name(pipeline_op::backward_weight) + where;
      if (run.activation_sent[here] >= 0 && run.got_activation[run.cell(stage + 1, mb)] == 0)
        return name(pipeline_op::send_activation) + where + " has no receive " +
               text({pipeline_op::receive_activation, stage + 1, mb});
      if (run.gradient_sent[here] >= 0 && run.got_gradient[run.cell(stage - 1, mb)] == 0)
        return name(pipeline_op::send_gradient) + where + " has no receive " +
               text({pipeline_op::receive_gradient, stage - 1, mb});
    }
  return {};
}

}  // namespace accel::detail::pp

namespace accel {

std::ostream& operator<<(std::ostream& out, const pipeline_action& action) {
  static constexpr const char* letters[] = {"F", "B", "I", "W", "SA", "RA", "SG", "RG"};
  const auto op = static_cast<std::size_t>(action.op);
  return out << (op < std::size(letters) ? letters[op] : "?") << action.stage << '.' << action.micro_batch;
}

std::vector<std::vector<pipeline_action>> make_pipeline_schedule(pipeline_schedule schedule, pipeline_shape shape) {
  namespace pp = detail::pp;
  pp::check_schedule_shape(schedule, shape, "accel::make_pipeline_schedule");
  std::vector<std::vector<pipeline_action>> lists;
  for (int process = 0; process < shape.processes; ++process) {
    const auto order = schedule == pipeline_schedule::gpipe ? pp::gpipe_order(shape, process)
                       : schedule == pipeline_schedule::interleaved_1f1b
                           ? pp::interleaved_order(shape, process)
                           : pp::one_f_one_b_order(shape, process, schedule == pipeline_schedule::zero_bubble);
    lists.push_back(pp::with_communication(order, shape, process));
  }
  return lists;
}

pipeline_simulation simulate_pipeline(const std::vector<std::vector<pipeline_action>>& actions, pipeline_shape shape,
                                      pipeline_costs costs) {
  detail::pp::check_shape(shape, "accel::simulate_pipeline");
  return simulate_pipeline(actions, shape,
                           std::vector<pipeline_costs>(static_cast<std::size_t>(shape.processes), costs));
}

pipeline_simulation simulate_pipeline(const std::vector<std::vector<pipeline_action>>& actions, pipeline_shape shape,
                                      const std::vector<pipeline_costs>& costs_per_process) {
  namespace pp = detail::pp;
  pp::check_shape(shape, "accel::simulate_pipeline");
  if (costs_per_process.size() != static_cast<std::size_t>(shape.processes))
    throw std::invalid_argument("accel::simulate_pipeline: " + std::to_string(costs_per_process.size()) +
                                " costs for " + std::to_string(shape.processes) +
                                " processes; give one pipeline_costs per process");
  pipeline_simulation result;
  if (actions.size() != static_cast<std::size_t>(shape.processes)) {
    result.problem =
        std::to_string(actions.size()) + " lists of actions for " + std::to_string(shape.processes) + " processes";
    return result;
  }
  pp::simulation_run run{actions, shape, costs_per_process};
  if (pp::run_all(run)) {
    run.problem = pp::deadlock(run);
    if (run.problem.empty()) run.problem = pp::missing(run);
  }
  result.completes = run.problem.empty();
  result.problem = run.problem;
  result.makespan = *std::max_element(run.clock.begin(), run.clock.end());
  result.bubble = result.makespan > 0 ? 1 - run.busy / (shape.processes * result.makespan) : 0;
  result.peak_activations = run.peak;
  return result;
}

double pipeline_bubble_formula(pipeline_schedule schedule, pipeline_shape shape) {
  detail::pp::check_schedule_shape(schedule, shape, "accel::pipeline_bubble_formula");
  const double p = shape.processes, v = shape.stages_per_process(), m = shape.micro_batches;
  switch (schedule) {
    case pipeline_schedule::gpipe:
    case pipeline_schedule::interleaved_1f1b:
    case pipeline_schedule::one_f_one_b:
      // A process's v stages take turns at the micro-batches; a turn's first forward waits for the p stages before
      // it, so every turn but the last takes max(m, p), the last m + p - 1 (and the backwards mirror them, twice as
      // long): (p - 1) / (v m + p - 1) when m >= p, GPipe's and 1F1B's (p - 1) / (m + p - 1) when v = 1.
      return 1 - v * m / (v * std::max(m, p) + std::min(m, p) - 1);
    case pipeline_schedule::zero_bubble:
      // m >= p: ZB-H1's (p - 1) / (3m + p - 1). m < p, a makespan of 2m + 2p - 1: the last process runs a forward
      // and an input gradient in turn from time p - 1, the last input gradient crosses the p - 1 other processes,
      // and process 0 ends with its weight gradient.
      return m >= p ? (p - 1) / (3 * m + p - 1) : 1 - 3 * m / (2 * m + 2 * p - 1);
  }
  return 0;
}

}  // namespace accel
