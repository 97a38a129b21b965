// acc.profile(): LibTorch's profiler over training steps (Accelerate's `profile` with `ProfileKwargs`): the Chrome
// trace written to output_trace_dir, read back by a strict JSON parser; torch.profiler's schedule and the
// on_trace_ready callback; shapes, FLOPs and memory; the errors.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "json_reader.hpp"
#include <accel/profiler.hpp>

#include "support.hpp"

// A program's own helper named as one of accel's: called unqualified with accel's events, it must be the one chosen,
// not ambiguous with accel::key_averages through argument-dependent lookup (a port broke so; issue 56). This file
// would not compile if it were.
namespace port {
int key_averages(const std::vector<accel::profile_event>& events) { return static_cast<int>(events.size()); }
int rows_of(const std::vector<accel::profile_event>& events) { return key_averages(events); }
}  // namespace port

namespace {

using namespace accel_test;
using Catch::Matchers::Contains;
using enum accel::profiler_action;

/// A 4 -> 8 -> 2 MLP trained with SGD, one step at a time.
struct training {
  using accelerator = accel::accelerator<>;
  explicit training(accelerator& on) : acc(on) {}
  /// One training step on a batch of `rows` rows: 2 addmm forward, 3 mm backward (fc1's input needs no gradient).
  void step(int rows) {
    opt.zero_grad();
    acc.backward(torch::mse_loss(model(torch::randn({rows, 4})), torch::randn({rows, 2})));
    opt.step();
  }
  accelerator& acc;
  mlp net{4, 8, 2};
  torch::optim::SGD optimizer{net->parameters(), 0.1};
  accel::prepared_model<mlp, accelerator> model = acc.prepare(net);
  accel::prepared_optimizer<torch::optim::SGD&, accelerator> opt = acc.prepare(optimizer);
};

bool profiler_enabled() { return torch::profiler::impl::profilerEnabled(); }

/// The trace's events (its "traceEvents"), read strictly.
std::vector<json::value> trace_events(const json::value& trace) {
  const auto& events = trace.at("traceEvents");
  REQUIRE(events.is_array());
  return events.items;
}

/// How many complete events ("ph": "X") of each name the trace holds.
std::map<std::string, int> complete_events(const json::value& trace) {
  std::map<std::string, int> names;
  for (const auto& event : trace_events(trace))
    if (event.at("ph").text == "X") ++names[event.at("name").text];
  return names;
}

/// The "args" of every complete event named `name`.
std::vector<json::value> args_of(const json::value& trace, const std::string& name) {
  std::vector<json::value> args;
  for (const auto& event : trace_events(trace))
    if (event.at("ph").text == "X" && event.at("name").text == name) args.push_back(event.at("args"));
  return args;
}

/// A JSON array of arrays of integers ("Input Dims") as vectors.
std::vector<std::vector<std::int64_t>> shapes_of(const json::value& dims) {
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& shape : dims.items) {
    shapes.emplace_back();
    for (const auto& size : shape.items) shapes.back().push_back(static_cast<std::int64_t>(size.number));
  }
  return shapes;
}

/// The `ProfilerStep#N` marks among a window's events.
std::set<std::string> step_marks(const std::vector<accel::profile_event>& events) {
  std::set<std::string> marks;
  for (const auto& event : events)
    if (event.category == "user_annotation" && event.name.starts_with("ProfilerStep#")) marks.insert(event.name);
  return marks;
}

/// The batch sizes of a window's forward matrix multiplications (their input's rows; needs record_shapes).
std::set<std::int64_t> batch_rows(const std::vector<accel::profile_event>& events) {
  std::set<std::int64_t> rows;
  for (const auto& event : events)
    if (event.name == "aten::addmm") rows.insert(event.input_shapes.at(1).at(0));
  return rows;
}

}  // namespace

TEST_CASE("acc.profile writes the training steps' Chrome trace to output_trace_dir/profile_0.json") {
  const auto dir = scratch_directory("profile_trace") / "traces" / "run";  // created by the profile
  accel::accelerator<> acc{{.cpu = true}};
  training run(acc);
  {
    auto prof = acc.profile({.output_trace_dir = dir});
    for (int i = 0; i < 3; ++i) run.step(5);
  }  // the end of the scope writes the trace
  CHECK_FALSE(profiler_enabled());
  const auto trace = json::parse_file(dir / "profile_0.json");
  const auto names = complete_events(trace);
  CHECK(names.at("aten::addmm") == 6);
  CHECK(names.at("aten::mm") == 9);
  CHECK(names.at("aten::relu") == 3);
  CHECK(names.at("aten::mse_loss") == 3);
  CHECK(names.count("aten::mse_loss_backward") == 1);  // 3 on 2.13, 6 on 1.13 (it calls its out= form)
  CHECK(names.at("autograd::engine::evaluate_function: AddmmBackward0") == 6);
  CHECK(names.at("aten::add_") >= 12);        // SGD: one per parameter and step
  CHECK(names.count("ProfilerStep#0") == 0);  // marks come with a schedule only
  for (const auto& event : trace_events(trace)) {
    if (event.at("ph").text != "X" || event.at("cat").text != "cpu_op") continue;
    CHECK(event.at("pid").number == ::getpid());
    CHECK(event.at("ts").is_number());
    CHECK(event.at("dur").number >= 0);
  }
  for (const auto& args : args_of(trace, "aten::addmm")) {  // no shapes without record_shapes
    const auto* dims = args.find("Input Dims");
    if (dims == nullptr) continue;
    for (const auto& shape : dims->items) CHECK(shape.items.empty());
  }
  accel::detail::remove_tree(dir.parent_path().parent_path());
}

// Not run by default (hidden): tests/scripts/check_profile_trace.py runs it, then reads the trace with Python's json.
TEST_CASE("write a profiler trace for Python", "[.python_profile]") {
  const char* where = std::getenv("ACCEL_TRACKING_DIR");
  REQUIRE(where != nullptr);
  accel::accelerator<> acc{{.cpu = true}};  // its batches are made on the CPU
  training run(acc);
  auto prof = acc.profile({.record_shapes = true, .output_trace_dir = std::filesystem::path(where) / "run"});
  for (int i = 0; i < 3; ++i) run.step(5);
  prof.finish();
}

TEST_CASE("profile_schedule gives torch.profiler.schedule's actions") {
  const auto actions = [](const accel::profile_schedule& schedule, int steps) {
    std::vector<accel::profiler_action> out;
    for (int step = 0; step < steps; ++step) out.push_back(accel::scheduled_action(schedule, step));
    return out;
  };
  using actions_t = std::vector<accel::profiler_action>;
  // Expected: torch.profiler.schedule(...) of PyTorch 2.13, step by step.
  CHECK(actions({.wait = 1, .warmup = 1, .active = 2, .repeat = 1}, 8) ==
        actions_t{none, warmup, record, record_and_save, none, none, none, none});
  CHECK(actions({.wait = 1, .warmup = 1, .active = 2, .repeat = 2, .skip_first = 2}, 13) ==
        actions_t{none, none, none, warmup, record, record_and_save, none, warmup, record, record_and_save, none, none,
                  none});
  CHECK(actions({.wait = 0, .warmup = 0, .active = 1}, 4) ==
        actions_t{record_and_save, record_and_save, record_and_save, record_and_save});
  CHECK(actions({.wait = 2, .warmup = 0, .active = 1}, 6) ==
        actions_t{none, none, record_and_save, none, none, record_and_save});
}

TEST_CASE("on_trace_ready is called once per recorded window, at its end, with that window's events") {
  const auto dir = scratch_directory("profile_windows");
  struct window {
    std::int64_t step;
    std::set<std::string> marks;
    std::set<std::int64_t> rows;
  };
  // Step i trains on a batch of i + 1 rows, so that each window's steps show in its shapes.
  const auto profile = [&dir](int repeat, int steps) {
    accel::accelerator<> acc{{.cpu = true}};
    training run(acc);
    std::vector<window> windows;
    auto prof = acc.profile({.schedule = accel::profile_schedule{.wait = 1, .warmup = 1, .active = 2, .repeat = repeat},
                             .on_trace_ready =
                                 [&](accel::profiler& p) {
                                   windows.push_back({p.step_num(), step_marks(p.events()), batch_rows(p.events())});
                                   p.export_chrome_trace(dir / ("window_" + std::to_string(p.step_num()) + ".json"));
                                 },
                             .record_shapes = true,
                             .output_trace_dir = dir / ("repeat_" + std::to_string(repeat))});
    for (int i = 0; i < steps; ++i) {
      CHECK(prof.action() == accel::scheduled_action({.wait = 1, .warmup = 1, .active = 2, .repeat = repeat}, i));
      run.step(i + 1);
      prof.step();
    }
    prof.finish();
    CHECK_FALSE(profiler_enabled());
    return windows;
  };

  SECTION("wait 1, warmup 1, active 2, repeat 1: one window, steps 2 and 3, handed over at step 4") {
    const auto windows = profile(1, 6);
    REQUIRE(windows.size() == 1);
    CHECK(windows[0].step == 4);
    CHECK(windows[0].marks == std::set<std::string>{"ProfilerStep#2", "ProfilerStep#3"});
    CHECK(windows[0].rows == std::set<std::int64_t>{3, 4});
  }
  SECTION("repeat 2: windows at steps 2-3 and 6-7; the file at the end holds the last one") {
    const auto windows = profile(2, 10);
    REQUIRE(windows.size() == 2);
    CHECK(windows[0].step == 4);
    CHECK(windows[0].marks == std::set<std::string>{"ProfilerStep#2", "ProfilerStep#3"});
    CHECK(windows[0].rows == std::set<std::int64_t>{3, 4});
    CHECK(windows[1].step == 8);
    CHECK(windows[1].marks == std::set<std::string>{"ProfilerStep#6", "ProfilerStep#7"});
    CHECK(windows[1].rows == std::set<std::int64_t>{7, 8});
    // What the callback exported, and what the end wrote (the last window, exported twice).
    const auto first = complete_events(json::parse_file(dir / "window_4.json"));
    CHECK(first.count("ProfilerStep#2") == 1);
    CHECK(first.count("ProfilerStep#6") == 0);
    CHECK(first.at("aten::addmm") == 4);
    const auto last = json::parse_file(dir / "repeat_2" / "profile_0.json");
    CHECK(complete_events(last).count("ProfilerStep#7") == 1);
    CHECK(complete_events(last).count("ProfilerStep#3") == 0);
    CHECK(json::parse_file(dir / "window_8.json").at("traceEvents").items.size() == trace_events(last).size());
  }
  SECTION("without a schedule: one window, the whole profile, handed over at its end") {
    accel::accelerator<> acc{{.cpu = true}};
    training run(acc);
    std::vector<std::int64_t> calls;
    std::size_t addmm = 0;
    {
      auto prof = acc.profile({.on_trace_ready = [&](accel::profiler& p) {
        calls.push_back(p.step_num());
        for (const auto& event : p.events()) addmm += event.name == "aten::addmm";
        CHECK(step_marks(p.events()).empty());
      }});
      for (int i = 0; i < 3; ++i) {
        run.step(2);
        prof.step();
        CHECK(prof.action() == record);
      }
      CHECK(calls.empty());
    }
    CHECK(calls == std::vector<std::int64_t>{3});
    CHECK(addmm == 6);
  }
  accel::detail::remove_tree(dir);
}

TEST_CASE("record_shapes puts each operator's input shapes and types in the trace") {
  const auto dir = scratch_directory("profile_shapes");
  accel::accelerator<> acc{{.cpu = true}};
  training run(acc);
  {
    auto prof = acc.profile({.record_shapes = true, .output_trace_dir = dir});
    run.step(5);
  }
  const auto trace = json::parse_file(dir / "profile_0.json");
  const auto addmm = args_of(trace, "aten::addmm");
  REQUIRE(addmm.size() == 2);
  // addmm(bias, input, weight.t(), beta, alpha) for fc1 (4 -> 8) and fc2 (8 -> 2), on 5 rows.
  using shapes = std::vector<std::vector<std::int64_t>>;
  CHECK(std::set{shapes_of(addmm[0].at("Input Dims")), shapes_of(addmm[1].at("Input Dims"))} ==
        std::set{shapes{{8}, {5, 4}, {4, 8}, {}, {}}, shapes{{2}, {5, 8}, {8, 2}, {}, {}}});
  const auto& types = addmm[0].at("Input type").items;
  REQUIRE(types.size() == 5);
  for (int i = 0; i < 3; ++i) CHECK(types[i].text == "float");
  accel::detail::remove_tree(dir);
}

TEST_CASE("with_flops counts the matrix multiplications' FLOPs, profile_memory records allocations") {
  accel::accelerator<> acc{{.cpu = true}};
  training run(acc);
  auto prof = acc.profile({.profile_memory = true, .with_stack = true, .with_flops = true, .with_modules = true});
  run.step(5);
  prof.finish();
  std::multiset<std::uint64_t> addmm_flops;
  bool allocated = false, freed = false;
  for (const auto& event : prof.events()) {
    if (event.name == "aten::addmm") addmm_flops.insert(event.flops);
    if (event.name == "[memory]") {
      CHECK(event.category == "cpu_instant_event");
      allocated = allocated || event.bytes > 0;
      freed = freed || event.bytes < 0;
    }
  }
  CHECK(addmm_flops == std::multiset<std::uint64_t>{2 * 5 * 4 * 8, 2 * 5 * 8 * 2});  // 2 M K N each
  CHECK(allocated);
  CHECK(freed);
  bool memory_in_trace = false;
  for (const auto& event : trace_events(json::parse(prof.chrome_trace())))
    memory_in_trace = memory_in_trace || (event.at("name").text == "[memory]" && event.at("ph").text == "i");
  CHECK(memory_in_trace);
}

// Issue 40, item 6: torch.profiler's prof.key_averages().table(sort_by=..., row_limit=...), which Accelerate's
// examples print.
TEST_CASE("key_averages: self and total time, calls, memory and FLOPs per name, and their table, exactly") {
  // Thread 1: a step mark around two linears, each around an addmm (one allocation in the first, a free in the
  // second); thread 2: an addmm of its own.
  const auto op = [](std::string name, std::int64_t start, std::int64_t duration, std::uint64_t thread = 1,
                     std::uint64_t flops = 0) {
    return accel::profile_event{.name = std::move(name),
                                .category = "cpu_op",
                                .start_ns = start,
                                .duration_ns = duration,
                                .thread = thread,
                                .flops = flops};
  };
  const auto memory = [](std::int64_t at, std::int64_t bytes) {
    return accel::profile_event{
        .name = "[memory]", .category = "cpu_instant_event", .start_ns = at, .thread = 1, .bytes = bytes};
  };
  const std::vector<accel::profile_event> events{
      op("step", 0, 10'000), op("aten::linear", 1'000, 4'000), op("aten::addmm", 1'500, 3'000, 1, 2'000'000),
      memory(2'000, 4096),   op("aten::linear", 6'000, 3'000), op("aten::addmm", 6'500, 2'000, 1, 1'000'000),
      memory(7'000, -1024),  op("aten::addmm", 500, 1'000, 2)};
  const auto averages = accel::key_averages(events);
  REQUIRE(averages.size() == 3);  // [memory] is no row
  CHECK(averages[0].key == "step");
  CHECK(averages[1].key == "aten::linear");
  const auto& step = averages.at("step");
  CHECK((step.count == 1 && step.cpu_time_total_ns == 10'000 && step.self_cpu_time_total_ns == 3'000));
  CHECK((step.cpu_memory_usage == 3072 && step.self_cpu_memory_usage == 0));
  const auto& linear = averages.at("aten::linear");
  CHECK((linear.count == 2 && linear.cpu_time_total_ns == 7'000 && linear.self_cpu_time_total_ns == 2'000));
  CHECK((linear.cpu_time_ns() == 3'500 && linear.cpu_memory_usage == 3072 && linear.self_cpu_memory_usage == 0));
  const auto& addmm = averages.at("aten::addmm");
  CHECK((addmm.count == 3 && addmm.cpu_time_total_ns == 6'000 && addmm.self_cpu_time_total_ns == 6'000));
  CHECK((addmm.cpu_memory_usage == 3072 && addmm.self_cpu_memory_usage == 3072 && addmm.flops == 3'000'000));
  CHECK_THROWS_WITH(averages.at("aten::mm"), Contains("no event named \"aten::mm\""));
  // Times rounded to microseconds (LibTorch 1.13): two calls side by side share a microsecond, counted once.
  const auto rounded =
      accel::key_averages({op("aten::linear", 0, 3'000), op("aten::t", 0, 2'000), op("aten::addmm", 1'000, 2'000)});
  CHECK(rounded.at("aten::linear").self_cpu_time_total_ns == 0);

  const auto right = [](const std::string& text, std::size_t width) {
    return std::string(width - text.size(), ' ') + text;
  };
  const std::vector<std::size_t> widths{11, 10, 8, 11, 9, 12, 7, 12, 10, 12};  // the rows shown decide
  const auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (std::size_t c = 0; c < cells.size(); ++c) text += (c == 0 ? "" : "  ") + right(cells[c], widths[c]);
    return text + "\n";
  };
  std::string rule;
  for (std::size_t c = 0; c < widths.size(); ++c) rule += (c == 0 ? "" : "  ") + std::string(widths[c], '-');
  rule += "\n";
  const std::string expected =
      rule +
      line({"Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "CPU Mem", "Self CPU Mem",
            "# of Calls", "Total MFLOPs"}) +
      rule +
      line({"aten::addmm", "54.55%", "6.000us", "54.55%", "6.000us", "2.000us", "3.00 Kb", "3.00 Kb", "3", "3.000"}) +
      line({"step", "27.27%", "3.000us", "90.91%", "10.000us", "10.000us", "3.00 Kb", "0 b", "1", "0.000"}) + rule +
      "Self CPU time total: 11.000us\n";
  CHECK(averages.table("self_cpu_time_total", 2) == expected);
  CHECK_THAT(averages.table(), Contains("aten::linear") && Contains("18.18%") && Contains("3.500us"));
  CHECK_THROWS_WITH(averages.table("cuda_time_total"), Contains("sort_by \"cuda_time_total\" is not one of"));
  CHECK(accel::detail::profile_time(1'234'567) == "1.235ms");
  CHECK(accel::detail::profile_time(2'000'000'000) == "2.000s");
  CHECK(accel::detail::profile_memory(3 * 1024 * 1024 / 2) == "1.50 Mb");
  CHECK(accel::detail::profile_memory(-8) == "-8 b");
}

TEST_CASE("key_averages over a real profile: calls per operator, self within total, grouped by input shapes") {
  accel::accelerator<> acc{{.cpu = true}};
  training run(acc);
  auto prof = acc.profile({.record_shapes = true});
  for (int i = 0; i < 3; ++i) run.step(5);
  prof.finish();
  const auto averages = prof.key_averages();
  CHECK(averages.at("aten::addmm").count == 6);  // 2 per step
  for (const auto& row : averages) {
    CHECK(row.self_cpu_time_total_ns >= 0);
    CHECK(row.self_cpu_time_total_ns <= row.cpu_time_total_ns);
  }
  const auto by_shape = prof.key_averages(/*group_by_input_shape=*/true);
  std::map<std::string, std::int64_t> addmm_calls;  // by input shapes
  for (const auto& row : by_shape)
    if (row.key == "aten::addmm") addmm_calls[accel::detail::profile_shapes(row.input_shapes)] = row.count;
  CHECK(addmm_calls == std::map<std::string, std::int64_t>{{"[[2], [5, 8], [8, 2], [], []]", 3},
                                                           {"[[8], [5, 4], [4, 8], [], []]", 3}});
  CHECK_THAT(by_shape.table("count"), Contains("Input Shapes") && Contains("[[8], [5, 4], [4, 8], [], []]"));
  const auto table = averages.table("cpu_time_total", 5);
  CHECK(std::count(table.begin(), table.end(), '\n') == 10);  // 3 rules, the header, 5 rows, the total
  CHECK_THAT(table, Contains("Self CPU time total: "));
}

TEST_CASE("an output_trace_dir that cannot be written: finish() throws naming it, the destructor prints it") {
  const auto scratch = scratch_directory("profile_unwritable");
  std::ofstream(scratch / "a_file") << "not a directory";
  const auto dir = scratch / "a_file" / "traces";  // root may write anywhere, but not below a file
  accel::accelerator<> acc{{.cpu = true}};
  training run(acc);
  auto prof = acc.profile({.output_trace_dir = dir});
  run.step(3);
  CHECK_THROWS_MATCHES(
      prof.finish(), accel::profile_error,
      Catch::Matchers::Message("accel::profile: cannot create output_trace_dir " + dir.string() +
                               " for profile_0.json: Not a directory; give output_trace_dir a directory this process "
                               "can write"));
  CHECK_FALSE(profiler_enabled());
  CHECK_NOTHROW(prof.finish());  // once only
  CHECK(prof.has_trace());       // the window itself was recorded

  std::ostringstream printed;
  auto* const cerr = std::cerr.rdbuf(printed.rdbuf());
  {
    auto quiet = acc.profile({.output_trace_dir = dir});
    run.step(3);
  }  // the destructor cannot throw
  std::cerr.rdbuf(cerr);
  CHECK_THAT(printed.str(), Contains("cannot create output_trace_dir " + dir.string()) && Contains("call finish()"));
  CHECK_FALSE(profiler_enabled());
  accel::detail::remove_tree(scratch);
}

TEST_CASE("a schedule that never records leaves nothing to write, and says why") {
  const auto dir = scratch_directory("profile_nothing");
  accel::accelerator<> acc{{.cpu = true}};
  training run(acc);
  auto prof =
      acc.profile({.schedule = accel::profile_schedule{.wait = 5, .warmup = 1, .active = 2}, .output_trace_dir = dir});
  for (int i = 0; i < 3; ++i) {
    run.step(2);
    prof.step();
  }
  CHECK_FALSE(prof.has_trace());
  CHECK_THROWS_WITH(prof.chrome_trace(), Contains("no recording window in 3 steps"));
  CHECK_THROWS_MATCHES(prof.finish(), accel::profile_error,
                       Catch::Matchers::Message(
                           "accel::profile: nothing to write to " + (dir / "profile_0.json").string() +
                           ": the schedule reached the end of no recording window in 3 steps (the first ends at "
                           "step skip_first + wait + warmup + active = 8); call step() after each training step, or "
                           "shorten the schedule"));
  CHECK_FALSE(std::filesystem::exists(dir / "profile_0.json"));
  CHECK_FALSE(profiler_enabled());
  accel::detail::remove_tree(dir);
}

TEST_CASE("profiles LibTorch cannot run are refused, one runs at a time, an error leaving the scope stops it") {
  accel::accelerator<> acc{{.cpu = true}};
  training run(acc);
  CHECK_THROWS_WITH((void)acc.profile({.schedule = accel::profile_schedule{.wait = -1, .active = 0}}),
                    "accel::profile_schedule: wait = -1 (need >= 0), warmup = 0 (need >= 0), active = 0 (need > 0), "
                    "repeat = 0 (need >= 0), skip_first = 0 (need >= 0)");
  if (!torch::cuda::is_available())
    CHECK_THROWS_WITH((void)acc.profile({.activities = {accel::profiler_activity::cuda}}), Contains("asks for cuda"));
  {
    auto first = acc.profile();
    CHECK(profiler_enabled());
    CHECK_THROWS_WITH((void)acc.profile(), Contains("a profiler is already running in this process"));
    CHECK(profiler_enabled());  // the first one goes on
  }
  CHECK_FALSE(profiler_enabled());

  SECTION("an exception leaving the scope: no callback, no file, the profiler off") {
    const auto dir = scratch_directory("profile_unwound");
    int calls = 0;
    const auto failing_step = [&] {
      auto prof = acc.profile({.on_trace_ready = [&](accel::profiler&) { ++calls; }, .output_trace_dir = dir});
      run.step(2);
      throw std::runtime_error("the training step failed");
    };
    CHECK_THROWS_WITH(failing_step(), "the training step failed");
    CHECK(calls == 0);
    CHECK_FALSE(std::filesystem::exists(dir / "profile_0.json"));
    CHECK_FALSE(profiler_enabled());
    accel::detail::remove_tree(dir);
  }
  SECTION("a callback that throws: step() throws it; the next window is recorded; the end stops the profiler") {
    int calls = 0;
    {
      auto prof = acc.profile({.schedule = accel::profile_schedule{.active = 1}, .on_trace_ready = [&](auto&) {
                                 if (++calls == 1) throw std::runtime_error("the callback failed");
                               }});
      run.step(2);
      CHECK_THROWS_WITH(prof.step(), "the callback failed");
      run.step(2);
      prof.step();
      CHECK(calls == 2);
      CHECK(prof.has_trace());
      CHECK(step_marks(prof.events()) == std::set<std::string>{"ProfilerStep#1"});
      run.step(2);
    }
    CHECK(calls == 3);
    CHECK_FALSE(profiler_enabled());
  }
  auto again = acc.profile();  // nothing is left running
  CHECK(profiler_enabled());
  again.finish();
  CHECK_FALSE(profiler_enabled());
}

TEST_CASE("a program's own key_averages(events) is its own: accel's is a function object, which ADL does not find",
          "[profile]") {
  const std::vector<accel::profile_event> events(3);
  CHECK(port::rows_of(events) == 3);
  CHECK(accel::key_averages(events).size() == 1);  // accel's, named: the three unnamed events in one row
}
