// The pipeline schedules and their simulator (accel/pipeline_schedule.hpp), without processes: every schedule runs to
// its end on the simulator for every shape up to 8 processes, 16 micro-batches and 4 stages per process; its bubble is
// its closed form's, and the textbook one's where that holds; its peak activations are pinned; the simulator catches
// every single action taken out and a swap that makes a cycle; two schedules are written out in full.
#include <accel/pipeline_schedule.hpp>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using accel::pipeline_action;
using accel::pipeline_op;
using accel::pipeline_schedule;
using accel::pipeline_shape;
using lists = std::vector<std::vector<pipeline_action>>;

constexpr pipeline_schedule all_schedules[] = {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b,
                                               pipeline_schedule::interleaved_1f1b, pipeline_schedule::zero_bubble};

bool one_stage_per_process(pipeline_schedule schedule) {
  return schedule == pipeline_schedule::one_f_one_b || schedule == pipeline_schedule::zero_bubble;
}

/// Every shape the tests run each schedule at: p 2..8, m 1..16, and 1..4 stages per process where it takes several.
std::vector<pipeline_shape> shapes_of(pipeline_schedule schedule) {
  std::vector<pipeline_shape> shapes;
  for (int p = 2; p <= 8; ++p)
    for (int v = 1; v <= (one_stage_per_process(schedule) ? 1 : 4); ++v)
      for (int m = 1; m <= 16; ++m) shapes.push_back({p * v, m, p});
  return shapes;
}

std::string describe(pipeline_schedule schedule, const pipeline_shape& shape) {
  return "schedule " + std::to_string(static_cast<int>(schedule)) + ", stages " + std::to_string(shape.stages) +
         ", micro-batches " + std::to_string(shape.micro_batches) + ", processes " + std::to_string(shape.processes);
}

std::string joined(const std::vector<pipeline_action>& actions) {
  std::ostringstream out;
  for (std::size_t i = 0; i < actions.size(); ++i) out << (i == 0 ? "" : " ") << actions[i];
  return out.str();
}

std::string refusal(pipeline_schedule schedule, pipeline_shape shape) {
  try {
    (void)accel::make_pipeline_schedule(schedule, shape);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

/// A backward or input gradient: what makes the gradient a send_gradient sends and a receive_gradient is for.
bool produces_gradient(pipeline_op op) { return op == pipeline_op::backward || op == pipeline_op::backward_input; }

bool is_send(pipeline_op op) { return op == pipeline_op::send_activation || op == pipeline_op::send_gradient; }

bool is_communication(pipeline_op op) {
  return op == pipeline_op::send_activation || op == pipeline_op::receive_activation ||
         op == pipeline_op::send_gradient || op == pipeline_op::receive_gradient;
}

}  // namespace

TEST_CASE("actions print as F2.3", "[pp_schedule]") {
  const auto text = [](pipeline_action a) {
    std::ostringstream out;
    out << a;
    return out.str();
  };
  CHECK(text({pipeline_op::forward, 2, 3}) == "F2.3");
  CHECK(text({pipeline_op::backward, 0, 1}) == "B0.1");
  CHECK(text({pipeline_op::backward_input, 1, 0}) == "I1.0");
  CHECK(text({pipeline_op::backward_weight, 1, 0}) == "W1.0");
  CHECK(text({pipeline_op::send_activation, 0, 4}) == "SA0.4");
  CHECK(text({pipeline_op::receive_activation, 1, 4}) == "RA1.4");
  CHECK(text({pipeline_op::send_gradient, 1, 4}) == "SG1.4");
  CHECK(text({pipeline_op::receive_gradient, 0, 12}) == "RG0.12");
}

TEST_CASE("every schedule completes at every shape", "[pp_schedule]") {
  for (const auto schedule : all_schedules)
    for (const auto& shape : shapes_of(schedule)) {
      INFO(describe(schedule, shape));
      const auto actions = accel::make_pipeline_schedule(schedule, shape);
      const auto run = accel::simulate_pipeline(actions, shape);
      REQUIRE(run.problem.empty());
      REQUIRE(run.completes);
      // Other costs change the times, never whether the lists complete: the order alone decides that.
      REQUIRE(accel::simulate_pipeline(actions, shape, {1, 2, 0.5}).completes);
      REQUIRE(accel::simulate_pipeline(actions, shape, {3, 0.25, 2}).completes);
      for (const auto& list : actions)  // v stages of m micro-batches on each process
        REQUIRE(std::count_if(list.begin(), list.end(), [](const auto& a) { return a.op == pipeline_op::forward; }) ==
                shape.stages_per_process() * shape.micro_batches);
      REQUIRE(accel::make_pipeline_schedule(schedule, shape) == actions);  // the same lists on every process
    }
}

TEST_CASE("each receive comes just before the action that needs it, each send just after its data", "[pp_schedule]") {
  for (const auto schedule : all_schedules)
    for (const auto& shape : shapes_of(schedule)) {
      INFO(describe(schedule, shape));
      for (const auto& list : accel::make_pipeline_schedule(schedule, shape))
        for (std::size_t i = 0; i < list.size(); ++i) {
          const auto& a = list[i];
          INFO("action " << i << " (" << a << ")");
          if (a.op == pipeline_op::receive_activation)
            REQUIRE(
                (i + 1 < list.size() && list[i + 1] == pipeline_action{pipeline_op::forward, a.stage, a.micro_batch}));
          if (a.op == pipeline_op::receive_gradient)
            REQUIRE((i + 1 < list.size() && produces_gradient(list[i + 1].op) && list[i + 1].stage == a.stage &&
                     list[i + 1].micro_batch == a.micro_batch));
          if (a.op == pipeline_op::send_activation)
            REQUIRE((i > 0 && list[i - 1] == pipeline_action{pipeline_op::forward, a.stage, a.micro_batch}));
          if (a.op == pipeline_op::send_gradient)
            REQUIRE((i > 0 && produces_gradient(list[i - 1].op) && list[i - 1].stage == a.stage &&
                     list[i - 1].micro_batch == a.micro_batch));
        }
    }
}

TEST_CASE("between two processes each kind of message is received in the order it is sent", "[pp_schedule]") {
  // (sender, receiver, gradient?) -> the (sending stage, micro-batch) in order, as sent and as received. The two kinds
  // together may cross: interleaved 1F1B on 2 processes with m = 5 receives SA0.3 before SG2.0, sent the other way.
  using channel = std::tuple<int, int, bool>;
  bool kinds_cross = false;
  for (const auto schedule : all_schedules)
    for (const auto& shape : shapes_of(schedule)) {
      INFO(describe(schedule, shape));
      const auto actions = accel::make_pipeline_schedule(schedule, shape);
      std::map<channel, std::vector<std::pair<int, int>>> sent, received;
      std::map<std::pair<int, int>, std::vector<pipeline_action>> sent_any, received_any;
      for (int r = 0; r < shape.processes; ++r)
        for (const auto& a : actions[static_cast<std::size_t>(r)]) {
          if (!is_communication(a.op)) continue;
          const bool gradient = a.op == pipeline_op::send_gradient || a.op == pipeline_op::receive_gradient;
          const int other = shape.process_of(a.stage + (gradient ? -1 : 1) * (is_send(a.op) ? 1 : -1));
          const int from = is_send(a.op) ? r : other, to = is_send(a.op) ? other : r;
          const int stage = is_send(a.op) ? a.stage : a.stage + (gradient ? 1 : -1);  // the sender's
          (is_send(a.op) ? sent : received)[{from, to, gradient}].emplace_back(stage, a.micro_batch);
          (is_send(a.op) ? sent_any : received_any)[{from, to}].push_back(
              {gradient ? pipeline_op::send_gradient : pipeline_op::send_activation, stage, a.micro_batch});
        }
      REQUIRE(sent == received);
      kinds_cross = kinds_cross || sent_any != received_any;
    }
  CHECK(kinds_cross);  // else the comment above, and what the executor is told, are out of date
}

TEST_CASE("one process: no sends or receives", "[pp_schedule]") {
  for (const auto schedule : all_schedules)
    for (int stages = 1; stages <= (one_stage_per_process(schedule) ? 1 : 4); ++stages)
      for (int m = 1; m <= 5; ++m) {
        const pipeline_shape shape{stages, m, 1};
        INFO(describe(schedule, shape));
        const auto actions = accel::make_pipeline_schedule(schedule, shape);
        REQUIRE(actions.size() == 1);
        CHECK(std::none_of(actions[0].begin(), actions[0].end(), [](const auto& a) { return is_communication(a.op); }));
        const auto run = accel::simulate_pipeline(actions, shape);
        CHECK(run.completes);
        CHECK(run.bubble == Approx(0).margin(1e-12));
        CHECK(accel::pipeline_bubble_formula(schedule, shape) == Approx(0).margin(1e-12));
      }
}

TEST_CASE("the measured bubble is the closed form's", "[pp_schedule]") {
  for (const auto schedule : all_schedules)
    for (const auto& shape : shapes_of(schedule)) {
      INFO(describe(schedule, shape));
      const auto run = accel::simulate_pipeline(accel::make_pipeline_schedule(schedule, shape), shape);
      REQUIRE(std::abs(run.bubble - accel::pipeline_bubble_formula(schedule, shape)) < 1e-9);
      // Equal costs: busy 3 per stage and micro-batch, so the makespan follows from the bubble.
      const double busy = 3.0 * shape.stages * shape.micro_batches;
      REQUIRE(std::abs(run.makespan * shape.processes * (1 - run.bubble) - busy) < 1e-6);
    }
}

TEST_CASE("the closed forms are the textbook ones where those hold", "[pp_schedule]") {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const double pd = p, md = m;
      INFO("p " << p << ", m " << m);
      const pipeline_shape one{p, m, p};
      CHECK(std::abs(accel::pipeline_bubble_formula(pipeline_schedule::gpipe, one) - (pd - 1) / (md + pd - 1)) < 1e-12);
      CHECK(std::abs(accel::pipeline_bubble_formula(pipeline_schedule::one_f_one_b, one) - (pd - 1) / (md + pd - 1)) <
            1e-12);
      if (m >= p)
        CHECK(std::abs(accel::pipeline_bubble_formula(pipeline_schedule::zero_bubble, one) -
                       (pd - 1) / (3 * md + pd - 1)) < 1e-12);
      for (int v = 1; v <= 4; ++v)
        if (m % p == 0) {
          const pipeline_shape looped{p * v, m, p};
          CHECK(std::abs(accel::pipeline_bubble_formula(pipeline_schedule::interleaved_1f1b, looped) -
                         (pd - 1) / (v * md + pd - 1)) < 1e-12);
        }
    }
  // Hand-counted: 1F1B on 2 processes and 3 micro-batches ends at 3 (m + p - 1) = 12, ZB-H1 at 3m + p - 1 = 10.
  const pipeline_shape shape{2, 3, 2};
  CHECK(
      accel::simulate_pipeline(accel::make_pipeline_schedule(pipeline_schedule::one_f_one_b, shape), shape).makespan ==
      12);
  CHECK(
      accel::simulate_pipeline(accel::make_pipeline_schedule(pipeline_schedule::zero_bubble, shape), shape).makespan ==
      10);
}

TEST_CASE("zero bubble's bubble is smaller than 1F1B's", "[pp_schedule]") {
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 16; ++m) {
      const pipeline_shape shape{p, m, p};
      INFO("p " << p << ", m " << m);
      const auto zb =
          accel::simulate_pipeline(accel::make_pipeline_schedule(pipeline_schedule::zero_bubble, shape), shape);
      const auto one =
          accel::simulate_pipeline(accel::make_pipeline_schedule(pipeline_schedule::one_f_one_b, shape), shape);
      REQUIRE(zb.completes);
      CHECK(zb.bubble < one.bubble - 1e-9);
    }
}

TEST_CASE("peak activations", "[pp_schedule]") {
  for (int p = 2; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      INFO("p " << p << ", m " << m);
      const pipeline_shape shape{p, m, p};
      const auto one =
          accel::simulate_pipeline(accel::make_pipeline_schedule(pipeline_schedule::one_f_one_b, shape), shape);
      const auto zb =
          accel::simulate_pipeline(accel::make_pipeline_schedule(pipeline_schedule::zero_bubble, shape), shape);
      REQUIRE(one.peak_activations.size() == static_cast<std::size_t>(p));
      REQUIRE(zb.peak_activations.size() == static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r) {
        CHECK(one.peak_activations[static_cast<std::size_t>(r)] == std::min(p - r, m));
        // ZB-H1 holds a micro-batch until its weight gradient: process r keeps up to r of those pending, so every
        // process holds 1F1B's largest count (process 0's), no more: the same peak over the pipeline.
        CHECK(zb.peak_activations[static_cast<std::size_t>(r)] == std::min(p, m));
      }
      CHECK(*std::max_element(zb.peak_activations.begin(), zb.peak_activations.end()) <=
            *std::max_element(one.peak_activations.begin(), one.peak_activations.end()));
      for (int v = 1; v <= 4; ++v) {
        const pipeline_shape looped{p * v, m, p};
        const auto gpipe =
            accel::simulate_pipeline(accel::make_pipeline_schedule(pipeline_schedule::gpipe, looped), looped);
        CHECK(gpipe.peak_activations == std::vector<int>(static_cast<std::size_t>(p), m * v));
        if (v == 1) continue;
        // Interleaved: its warm-up forwards and one more, (v - 1) * (first round) + 2 (p - 1 - r) + 1, at most v m.
        const auto interleaved = accel::simulate_pipeline(
            accel::make_pipeline_schedule(pipeline_schedule::interleaved_1f1b, looped), looped);
        const int rounds = std::max(1, m / p), first_round = (m + rounds - 1) / rounds;
        for (int r = 0; r < p; ++r)
          CHECK(interleaved.peak_activations[static_cast<std::size_t>(r)] ==
                std::min(v * m, (v - 1) * first_round + 2 * (p - 1 - r) + 1));
      }
    }
}

TEST_CASE("1F1B on 2 processes and 3 micro-batches, written out", "[pp_schedule]") {
  const auto actions = accel::make_pipeline_schedule(pipeline_schedule::one_f_one_b, {2, 3, 2});
  REQUIRE(actions.size() == 2);
  CHECK(joined(actions[0]) == "F0.0 SA0.0 F0.1 SA0.1 RG0.0 B0.0 F0.2 SA0.2 RG0.1 B0.1 RG0.2 B0.2");
  CHECK(joined(actions[1]) == "RA1.0 F1.0 B1.0 SG1.0 RA1.1 F1.1 B1.1 SG1.1 RA1.2 F1.2 B1.2 SG1.2");
}

TEST_CASE("GPipe on 2 processes and 2 micro-batches, written out", "[pp_schedule]") {
  const auto actions = accel::make_pipeline_schedule(pipeline_schedule::gpipe, {2, 2, 2});
  REQUIRE(actions.size() == 2);
  CHECK(joined(actions[0]) == "F0.0 SA0.0 F0.1 SA0.1 RG0.0 B0.0 RG0.1 B0.1");
  CHECK(joined(actions[1]) == "RA1.0 F1.0 RA1.1 F1.1 B1.0 SG1.0 B1.1 SG1.1");
}

TEST_CASE("ZB-H1 on 3 processes and 3 micro-batches, written out", "[pp_schedule]") {
  const auto actions = accel::make_pipeline_schedule(pipeline_schedule::zero_bubble, {3, 3, 3});
  REQUIRE(actions.size() == 3);
  CHECK(joined(actions[0]) == "F0.0 SA0.0 F0.1 SA0.1 F0.2 SA0.2 RG0.0 I0.0 W0.0 RG0.1 I0.1 W0.1 RG0.2 I0.2 W0.2");
  CHECK(joined(actions[1]) ==
        "RA1.0 F1.0 SA1.0 RA1.1 F1.1 SA1.1 RG1.0 I1.0 SG1.0 RA1.2 F1.2 SA1.2 RG1.1 I1.1 SG1.1 W1.0 RG1.2 I1.2 SG1.2 "
        "W1.1 W1.2");
  CHECK(joined(actions[2]) == "RA2.0 F2.0 I2.0 SG2.0 RA2.1 F2.1 I2.1 SG2.1 RA2.2 F2.2 I2.2 SG2.2 W2.0 W2.1 W2.2");
}

TEST_CASE("interleaved 1F1B on 2 processes, 2 stages each, 4 micro-batches, written out", "[pp_schedule]") {
  const auto actions = accel::make_pipeline_schedule(pipeline_schedule::interleaved_1f1b, {4, 4, 2});
  REQUIRE(actions.size() == 2);
  CHECK(joined(actions[0]) ==
        "F0.0 SA0.0 F0.1 SA0.1 RA2.0 F2.0 SA2.0 RA2.1 F2.1 SA2.1 F0.2 SA0.2 RG2.0 B2.0 SG2.0 F0.3 SA0.3 RG2.1 B2.1 "
        "SG2.1 RA2.2 F2.2 SA2.2 RG0.0 B0.0 RA2.3 F2.3 SA2.3 RG0.1 B0.1 RG2.2 B2.2 SG2.2 RG2.3 B2.3 SG2.3 RG0.2 B0.2 "
        "RG0.3 B0.3");
  CHECK(joined(actions[1]) ==
        "RA1.0 F1.0 SA1.0 RA1.1 F1.1 SA1.1 RA3.0 F3.0 B3.0 SG3.0 RA3.1 F3.1 B3.1 SG3.1 RA1.2 F1.2 SA1.2 RG1.0 B1.0 "
        "SG1.0 RA1.3 F1.3 SA1.3 RG1.1 B1.1 SG1.1 RA3.2 F3.2 B3.2 SG3.2 RA3.3 F3.3 B3.3 SG3.3 RG1.2 B1.2 SG1.2 RG1.3 "
        "B1.3 SG1.3");
}

TEST_CASE("any single action taken out is caught", "[pp_schedule]") {
  const std::vector<std::pair<pipeline_schedule, pipeline_shape>> cases = {
      {pipeline_schedule::one_f_one_b, {2, 3, 2}},
      {pipeline_schedule::gpipe, {3, 2, 3}},
      {pipeline_schedule::gpipe, {4, 3, 2}},
      {pipeline_schedule::zero_bubble, {3, 4, 3}},
      {pipeline_schedule::interleaved_1f1b, {4, 3, 2}},
      {pipeline_schedule::interleaved_1f1b, {6, 4, 2}},
      {pipeline_schedule::interleaved_1f1b, {2, 2, 1}}};
  for (const auto& [schedule, shape] : cases) {
    const auto actions = accel::make_pipeline_schedule(schedule, shape);
    for (std::size_t process = 0; process < actions.size(); ++process)
      for (std::size_t i = 0; i < actions[process].size(); ++i) {
        auto cut = actions;
        cut[process].erase(cut[process].begin() + static_cast<std::ptrdiff_t>(i));
        INFO(describe(schedule, shape) << ": without action " << i << " (" << actions[process][i] << ") of process "
                                       << process);
        const auto run = accel::simulate_pipeline(cut, shape);
        CHECK_FALSE(run.completes);
        CHECK_FALSE(run.problem.empty());
      }
  }
}

TEST_CASE("what the simulator says of a removed receive, send and forward", "[pp_schedule]") {
  const pipeline_shape shape{2, 3, 2};
  const auto actions = accel::make_pipeline_schedule(pipeline_schedule::one_f_one_b, shape);
  auto no_receive = actions;  // RA1.1: process 1's forward of micro-batch 1 has nothing to take
  no_receive[1].erase(no_receive[1].begin() + 4);
  auto run = accel::simulate_pipeline(no_receive, shape);
  CHECK_FALSE(run.completes);
  CHECK(run.problem ==
        "process 1, action 4 (F1.1): waits forever for its input: no receive_activation (RA1.1) "
        "before it");
  auto no_send = actions;  // SG1.0: process 0 waits at RG0.0 for it
  no_send[1].erase(no_send[1].begin() + 3);
  run = accel::simulate_pipeline(no_send, shape);
  CHECK(run.problem ==
        "deadlock: process 0 waits at action 4 (RG0.0) for SG1.0 from process 1; process 1 waits at action 7 (RA1.2) "
        "for SA0.2 from process 0");
  auto no_forward = actions;  // F0.2: its send has no data
  no_forward[0].erase(no_forward[0].begin() + 6);
  run = accel::simulate_pipeline(no_forward, shape);
  CHECK(run.problem == "process 0, action 6 (SA0.2): sends an activation before its forward ran");
  auto no_weight = accel::make_pipeline_schedule(pipeline_schedule::zero_bubble, shape);
  no_weight[1].pop_back();
  run = accel::simulate_pipeline(no_weight, shape);
  CHECK(run.problem == "missing: no weight gradient W1.2 on process 1");
}

TEST_CASE("a swap that makes a cycle is a deadlock", "[pp_schedule]") {
  const pipeline_shape shape{2, 2, 2};
  auto actions = accel::make_pipeline_schedule(pipeline_schedule::gpipe, shape);
  REQUIRE(accel::simulate_pipeline(actions, shape).completes);
  std::swap(actions[0][3], actions[0][4]);  // process 0 waits for RG0.0 before sending SA0.1, which process 1 awaits
  const auto run = accel::simulate_pipeline(actions, shape);
  CHECK_FALSE(run.completes);
  CHECK(run.problem ==
        "deadlock: process 0 waits at action 3 (RG0.0) for SG1.0 from process 1; process 1 waits at action 2 (RA1.1) "
        "for SA0.1 from process 0");
}

TEST_CASE("the simulator's rules", "[pp_schedule]") {
  const pipeline_shape two{2, 1, 2};
  const auto problem = [&](const lists& actions, pipeline_shape shape) {
    return accel::simulate_pipeline(actions, shape).problem;
  };
  using op = pipeline_op;
  CHECK(problem({{{op::forward, 1, 0}}, {}}, two) == "process 0, action 0 (F1.0): stage 1 runs on process 1");
  CHECK(problem({{{op::forward, 2, 0}}, {}}, two) ==
        "process 0, action 0 (F2.0): stage or micro-batch out of range (2 stages, 1 micro-batches)");
  CHECK(problem({{{op::forward, 0, 1}}, {}}, two) ==
        "process 0, action 0 (F0.1): stage or micro-batch out of range (2 stages, 1 micro-batches)");
  CHECK(problem({{{op::forward, 0, 0}, {op::forward, 0, 0}}, {}}, two) ==
        "process 0, action 1 (F0.0): a second forward of this micro-batch");
  CHECK(problem({{{op::backward, 0, 0}}, {}}, two) == "process 0, action 0 (B0.0): a backward before its forward");
  const pipeline_shape local{2, 1, 1};  // both stages on one process: no sends between them
  CHECK(problem({{{op::forward, 0, 0}, {op::send_activation, 0, 0}}}, local) ==
        "process 0, action 1 (SA0.0): sends to stage 1 on the same process (a local hand-off)");
  CHECK(problem({{{op::forward, 1, 0}}}, local) ==
        "process 0, action 0 (F1.0): runs before the forward of stage 0 on the same process, whose output it takes");
  const pipeline_shape single{1, 1, 1};
  CHECK(problem({{{op::forward, 0, 0}, {op::backward_weight, 0, 0}}}, single) ==
        "process 0, action 1 (W0.0): a weight gradient before (or without) its backward_input");
  CHECK(problem({{{op::forward, 0, 0}, {op::backward, 0, 0}, {op::backward_weight, 0, 0}}}, single) ==
        "process 0, action 2 (W0.0): a weight gradient before (or without) its backward_input");
  CHECK(problem({{{op::forward, 0, 0}, {op::send_activation, 0, 0}}}, single) ==
        "process 0, action 1 (SA0.0): sends to stage 1, which does not exist");
  CHECK(problem({{{op::forward, 0, 0}}}, single) == "missing: no backward B0.0 (or I0.0) on process 0");
  CHECK(problem({{{op::forward, 0, 0}, {op::send_activation, 0, 0}, {op::receive_gradient, 0, 0}, {op::backward, 0, 0}},
                 {{op::forward, 1, 0}}},
                two) ==
        "process 1, action 0 (F1.0): waits forever for its input: no receive_activation (RA1.0) before it");
  CHECK(problem({{}}, two) == "1 lists of actions for 2 processes");
  CHECK(accel::simulate_pipeline({{{op::forward, 0, 0}, {op::backward, 0, 0}}}, single).completes);
}

TEST_CASE("costs: compute takes its cost, a receive waits for its send", "[pp_schedule]") {
  const pipeline_shape shape{2, 1, 2};
  const auto actions = accel::make_pipeline_schedule(pipeline_schedule::one_f_one_b, shape);
  // F0.0 (1), F1.0 (1), B1.0 (2 + 3), B0.0 (2 + 3): 12 in all, half of it busy.
  const auto run = accel::simulate_pipeline(actions, shape, {1, 2, 3});
  CHECK(run.completes);
  CHECK(run.makespan == 12);
  CHECK(run.bubble == Approx(0.5));
}

TEST_CASE("at unequal costs: ZB-H1's (p - 1)(F + B - W) idle per process, the others' bubble unchanged",
          "[pp_schedule]") {
  // ZB-H1's formula holds where a weight part costs no more than a forward or an input part (W <= F, B), as a Linear
  // layer's does.
  for (const accel::pipeline_costs costs : {accel::pipeline_costs{1, 1, 0.87}, accel::pipeline_costs{1, 0.95, 0.92},
                                            accel::pipeline_costs{1, 1.3, 0.6}, accel::pipeline_costs{1.2, 1, 0.9}}) {
    for (int p = 2; p <= 8; ++p) {
      for (int m = p; m <= 16; ++m) {
        CAPTURE(costs.forward, costs.backward_input, costs.backward_weight, p, m);
        const pipeline_shape shape{p, m, p};
        const double idle = (p - 1) * (costs.forward + costs.backward_input - costs.backward_weight);
        const double busy = m * (costs.forward + costs.backward_input + costs.backward_weight);
        CHECK(
            accel::simulate_pipeline(accel::make_pipeline_schedule(pipeline_schedule::zero_bubble, shape), shape, costs)
                .bubble == Approx(idle / (busy + idle)));
        for (const auto schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b})
          CHECK(accel::simulate_pipeline(accel::make_pipeline_schedule(schedule, shape), shape, costs).bubble ==
                Approx(accel::pipeline_bubble_formula(schedule, shape)));
        const pipeline_shape interleaved{2 * p, m, p};
        CHECK(accel::simulate_pipeline(accel::make_pipeline_schedule(pipeline_schedule::interleaved_1f1b, interleaved),
                                       interleaved, costs)
                  .bubble == Approx(accel::pipeline_bubble_formula(pipeline_schedule::interleaved_1f1b, interleaved)));
      }
    }
  }
}

TEST_CASE("per-process costs: equal ones are one triple's, and the slowest process sets the pace", "[pp_schedule]") {
  // What scripts/bench.sh pp compares a measured bubble with: each process at its own measured costs.
  const accel::pipeline_costs fast{1, 1, 1}, slow{2, 2, 2};  // a backward: 2 and 4
  for (int p = 2; p <= 6; ++p) {
    for (int m = p; m <= 12; ++m) {
      CAPTURE(p, m);
      const pipeline_shape shape{p, m, p};
      for (const auto schedule :
           {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b, pipeline_schedule::zero_bubble}) {
        const auto actions = accel::make_pipeline_schedule(schedule, shape);
        const accel::pipeline_costs costs{1, 0.9, 0.8};
        const auto alike = accel::simulate_pipeline(actions, shape, std::vector(static_cast<std::size_t>(p), costs));
        const auto one_triple = accel::simulate_pipeline(actions, shape, costs);
        CHECK(alike.makespan == one_triple.makespan);
        CHECK(alike.bubble == one_triple.bubble);
      }
      // 1F1B with the last process twice as slow: the first micro-batch's forward reaches it, it then runs its m
      // forwards and backwards without waiting, and the last gradient crosses the p - 1 others' backwards.
      auto costs = std::vector(static_cast<std::size_t>(p), fast);
      costs.back() = slow;
      const auto run =
          accel::simulate_pipeline(accel::make_pipeline_schedule(pipeline_schedule::one_f_one_b, shape), shape, costs);
      CHECK(run.completes);
      CHECK(run.makespan == (p - 1) * 1.0 + m * (2.0 + 4.0) + (p - 1) * 2.0);
    }
  }
  CHECK_THROWS_WITH(accel::simulate_pipeline(accel::make_pipeline_schedule(pipeline_schedule::gpipe, {2, 2, 2}),
                                             {2, 2, 2}, std::vector<accel::pipeline_costs>(3)),
                    Catch::Contains("3 costs for 2 processes; give one pipeline_costs per process"));
}

TEST_CASE("bad shapes are refused, naming the fix", "[pp_schedule]") {
  CHECK_THAT(refusal(pipeline_schedule::one_f_one_b, {4, 4, 2}), Catch::Contains("use interleaved_1f1b"));
  CHECK_THAT(refusal(pipeline_schedule::zero_bubble, {6, 4, 3}), Catch::Contains("use interleaved_1f1b"));
  CHECK_THAT(refusal(pipeline_schedule::gpipe, {6, 4, 4}),
             Catch::Contains("stages (6) is not a multiple of processes (4); use 8 stages"));
  CHECK_THAT(refusal(pipeline_schedule::interleaved_1f1b, {0, 4, 1}), Catch::Contains("stages is 0; give at least 1"));
  CHECK_THAT(refusal(pipeline_schedule::gpipe, {2, 0, 2}), Catch::Contains("micro_batches is 0; give at least 1"));
  CHECK_THAT(refusal(pipeline_schedule::gpipe, {2, 2, -1}), Catch::Contains("processes is -1; give at least 1"));
  CHECK_THAT(refusal(static_cast<pipeline_schedule>(9), {2, 2, 2}), Catch::Contains("is none of gpipe"));
  CHECK_THROWS_AS(accel::simulate_pipeline({}, {3, 1, 2}), std::invalid_argument);
  CHECK_THROWS_AS(accel::pipeline_bubble_formula(pipeline_schedule::one_f_one_b, {4, 4, 2}), std::invalid_argument);
}
