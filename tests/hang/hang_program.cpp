// The flight recorder and the hang watch (detail/comm/flight_recorder.hpp), in a program of their own so that they
// build without the big test binaries. `ring`: the ring buffer alone (wraps at N, order, states, labels, the dump's
// pickle read back) and the cost of one record. Under `accel launch` (tests/scripts/check_hang.py drives them):
// `sleeping`, process 1 sleeps before an all-reduce the others enter; `vanishing`, the second half of the processes
// do (in the namespace cluster, machine1's, whose machine then vanishes: tests/scripts/check_cluster.py);
// `desync`, process 1 all-gathers where the others all-reduce; `signal`, SIGUSR1 makes every process dump;
// `straggler`, the straggler report names a process that sleeps in each step. `ring` also checks the report's verdict.
// Prints one line per failed check and exits 1 if any failed.
#include <accel/accelerator.hpp>
#include <accel/tracking.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <accel/detail/comm/flight_recorder.hpp>
#include <accel/detail/comm/flight_trace.hpp>
#include <accel/detail/support/straggler_report.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  std::cout << "FAILED: " << what << "\n";
}

const accel::detail::collective_operands operands{{{4, 2}}, {{4, 2}}, {"Float"}, {"Float"}};

// Six collectives into a ring of four: the first two overwritten, the rest oldest first.
void check_wrapping() {
  using namespace accel::detail;
  flight_recorder ring(4);
  ring.add_group("default", {0, 1}, 1, 2);
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 6; ++i) {
    collective_caller outer("backward");
    collective_caller inner("wait_for_everyone");  // nested: the outer call is what the user made
    ids.push_back(
        ring.record("default", i % 2 ? "broadcast" : "all_reduce", false, operands, std::chrono::milliseconds(1000)));
  }
  ring.started(ids[3]);
  ring.completed(ids[4]);
  ring.completed(ids[0]);  // overwritten: changes nothing
  const auto entries = ring.entries();
  check(entries.size() == 4, "a ring of 4 holds 4 entries after 6 records, not " + std::to_string(entries.size()));
  for (std::size_t i = 0; i < entries.size(); ++i) {
    check(entries[i].record_id == i + 2, "entry " + std::to_string(i) + " is record " + std::to_string(i + 2));
    check(entries[i].collective_seq_id == i + 3,
          "entry " + std::to_string(i) + " has sequence number " + std::to_string(i + 3));
    check(entries[i].issued_by == "backward", "entries are issued by the outermost call");
  }
  check(entries[0].state == collective_state::scheduled, "record 2 stays scheduled");
  check(entries[1].state == collective_state::started && entries[1].time_started_ns > 0, "record 3 started");
  check(entries[2].state == collective_state::completed && entries[2].time_completed_ns >= entries[2].time_created_ns,
        "record 4 completed after it was created");
  check(collective_caller::current() == nullptr, "the label ends with its scopes");
  auto pending = ring.oldest_pending();
  check(pending && pending->record_id == 2, "the oldest pending collective is record 2");
  // The dump as PyTorch's analyser reads it, read back by accel's own reader.
  const auto dump = read_pickle(write_pickle(ring.dump()), "the ring's dump");
  check(dump.at("version").as_string("version") == "2.10", "the dump has PyTorch's version");
  check(dump.at("pg_config").at("default").at("ranks").as_string("ranks") == "[0, 1]", "pg_config lists the ranks");
  const auto& listed = dump.at("entries").as_sequence("entries");
  check(listed.size() == 4 && listed[1].at("state").as_string("state") == "started" &&
            listed[1].at("profiling_name").as_string("name") == "gloo:broadcast",
        "the dump's entries are the ring's, oldest first");
  flight_recorder off(0);
  check(!off.enabled() && off.record("default", "all_reduce", false, operands, {}) == 0, "a ring of 0 records none");
}

// One record (and its completion) costs well under a microsecond once the ring's slots are warm.
void check_cost() {
  using namespace accel::detail;
  flight_recorder ring(2000);
  ring.add_group("default", {0}, 0, 1);
  collective_caller caller("backward");
  for (int i = 0; i < 4000; ++i) ring.completed(ring.record("default", "all_reduce", false, operands, {}));
  constexpr int n = 200000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) ring.completed(ring.record("default", "all_reduce", false, operands, {}));
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / n;
  std::cout << "one record and its completion: " << ns << " ns\n";
  check(ns < 1000, "a record costs " + std::to_string(ns) + " ns, not under 1 us");
}

// The straggler report's verdict on given figures, and its window's bounds.
void check_straggler_verdict() {
  accel::detail::straggler_report report(10);
  const auto named = report.judge({0.020, 0.050, 0.021}, 100);
  check(named.slowest == 1 && named.slowest_ratio == 2.5, "process 1 is the slowest, at 2.5x");
  check(named.warning.find("process 1 worked 2.50x as long per optimizer step as the fastest, process 0 (50.0 ms "
                           "against 20.0 ms") != std::string::npos &&
            named.warning.find("over steps 91 to 100") != std::string::npos,
        "the warning names process 1, the fastest, the times and the steps: " + named.warning);
  check(named.warning.find("process 2 worked") == std::string::npos, "process 2 (1.05x) is no straggler");
  check(report.judge({0.020, 0.029}, 10).warning.empty(), "1.45x is under the threshold: no warning");
  bool refused = false;
  try {
    accel::detail::straggler_report negative(-1);
  } catch (const std::invalid_argument&) {
    refused = true;
  }
  check(refused, "a negative straggler_window is refused");
  accel::detail::straggler_report off(0);
  check(!off.stepped(), "a window of 0 reports nothing");
}

// A tracker that keeps what it is given.
class recording_tracker final : public accel::general_tracker {
 public:
  [[nodiscard]] std::string name() const override { return "recording"; }
  void log(const std::vector<accel::metric>& metrics, std::int64_t step) override {
    for (const auto& m : metrics) logged.emplace_back(m.name, m.value(), step);
  }
  std::vector<std::tuple<std::string, double, std::int64_t>> logged;
};

// A data-parallel training loop with straggler_window = 10 in which process 1 sleeps 30 ms in each step: the main
// process's warnings name process 1, and its tracker gets the slowest process and its ratio at steps 11, 21, 31.
int run_straggler() {
  accel::options opts;
  opts.straggler_window = 10;
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc(opts);
  auto tracker = std::make_shared<recording_tracker>();
  acc.init_trackers("straggler", std::vector<accel::hyperparameter>{}, {tracker});
  torch::nn::Linear net(16, 16);
  torch::optim::SGD sgd(net->parameters(), 0.01);
  auto [model, optimizer] = acc.prepare(net, sgd);
  std::ostringstream warnings;
  auto* const stderr_buffer = std::cerr.rdbuf(warnings.rdbuf());
  for (int step = 0; step < 40; ++step) {
    if (acc.process_index() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    acc.backward(model(at::ones({8, 16})).square().mean());
    optimizer.step();
    optimizer.zero_grad();
  }
  std::cerr.rdbuf(stderr_buffer);
  std::cerr << warnings.str();
  acc.end_training();
  if (!acc.is_main_process()) return EXIT_SUCCESS;
  check(warnings.str().find("accel: straggler: process 1 worked") != std::string::npos,
        "the main process's warnings name process 1");
  std::vector<std::int64_t> steps;
  for (const auto& [name, value, step] : tracker->logged) {
    if (name == "straggler/slowest_process") check(value == 1, "the tracker's slowest process is 1");
    if (name != "straggler/slowest_ratio") continue;
    steps.push_back(step);
    check(value > accel::detail::straggler_report::threshold,
          "the tracker's ratio " + std::to_string(value) + " is over the threshold");
  }
  check(steps == std::vector<std::int64_t>{11, 21, 31}, "the tracker got a ratio at steps 11, 21 and 31");
  if (failures == 0) std::cout << "the straggler report named process 1: every check passed\n";
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

// Collectives until the scenario's point: three all-reduces, a barrier, a gather.
int run_job(const std::string& scenario) {
  accel::options opts;
  opts.timeout = std::chrono::seconds(60);
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc(opts);
  const int rank = acc.process_index();
  auto t = at::ones({4, 2});
  for (int i = 0; i < 3; ++i) t = acc.reduce(t);
  acc.wait_for_everyone();
  (void)acc.gather(at::full({2}, rank));
  // When the hang starts, for the driver's clock (seconds since the epoch).
  const auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::ostringstream line;  // written at once: the processes share the launcher's stderr
  line << std::fixed << "process " << rank << " reaches the scenario's collective at " << now << " s\n";
  std::cerr << line.str() << std::flush;
  const bool sleeps = scenario == "sleeping" ? rank == 1 : scenario == "vanishing" && 2 * rank >= acc.num_processes();
  if (sleeps) std::this_thread::sleep_for(std::chrono::seconds(60));
  if (scenario == "desync" && rank == 1) {
    (void)acc.gather(t);
  } else {
    t = acc.reduce(t);
  }
  std::cout << "process " << rank << " went past the collective it should have hung in\n";
  return 1;
}

// SIGUSR1 makes each process's hang watch dump its record, which then holds this process's collectives so far.
int run_signal_dump() {
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc;
  auto model = acc.prepare(torch::nn::Linear(4, 2));  // broadcast, issued by prepare
  auto loss = model(at::ones({3, 4})).sum();
  acc.backward(loss);  // the gradient bucket's all-reduce, issued by backward
  auto t = at::ones({3});
  for (int i = 0; i < 4; ++i) t = acc.reduce(t);
  acc.wait_for_everyone();
  const char* directory = std::getenv("ACCEL_FLIGHT_RECORDER_DIR");
  check(directory != nullptr, "ACCEL_FLIGHT_RECORDER_DIR is set");
  if (directory == nullptr) return EXIT_FAILURE;
  const auto file = std::string(directory) + "/accel_trace_rank_" + std::to_string(acc.process_index());
  std::remove(file.c_str());
  std::raise(SIGUSR1);  // the default action would end the process: the watch's handler must be in place
  std::string bytes;
  for (int waited = 0; waited < 100 && bytes.empty(); ++waited) {  // the watch looks every half second
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  check(!bytes.empty(), "SIGUSR1 made the hang watch write " + file + " within 5 s");
  if (bytes.empty()) return EXIT_FAILURE;
  const auto trace = accel::detail::read_process_trace(bytes, file, -1);
  check(trace.rank == acc.process_index(), "the dump names this process");
  const auto& mine = trace.collectives.at("default");
  const auto reduces = std::count_if(mine.begin(), mine.end(), [](const auto& c) {
    return c.operation == "all_reduce" && c.issued_by == "reduce" && c.state == "completed";
  });
  check(reduces == 4, "the dump holds the 4 completed all-reduces issued by reduce, not " + std::to_string(reduces));
  const auto issued = [&](const char* operation, const char* call) {
    return std::any_of(mine.begin(), mine.end(), [&](const auto& c) {
      return c.operation == operation && c.issued_by == call && c.state == "completed";
    });
  };
  check(issued("broadcast", "prepare"), "prepare's broadcast is recorded as issued by prepare");
  check(issued("all_reduce", "backward"), "the gradients' all-reduce is recorded as issued by backward");
  check(!mine.empty() && mine.back().operation == "barrier" && mine.back().issued_by == "wait_for_everyone",
        "the last collective is wait_for_everyone's barrier");
  acc.wait_for_everyone();
  if (failures == 0) std::cout << "process " << acc.process_index() << ": SIGUSR1 dumped its flight record\n";
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "ring") {
    check_wrapping();
    check_cost();
    check_straggler_verdict();
    if (failures == 0) std::cout << "the flight recorder's ring: every check passed\n";
    return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
  }
  if (mode == "sleeping" || mode == "desync" || mode == "vanishing") return run_job(mode);
  if (mode == "signal") return run_signal_dump();
  if (mode == "straggler") return run_straggler();
  std::cerr << "usage: accel_hang_program ring | sleeping | desync | vanishing | signal | straggler\n";
  return 2;
}
