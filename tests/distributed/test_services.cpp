// The services beside training on several processes (trackers, progress bars, the profiler): a file of its own, so
// that a change to a service's header recompiles these cases, not the other distributed tests.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <accel/profiler.hpp>
#include <accel/progress.hpp>
#include <accel/tracking.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "json_reader.hpp"
#include "recording_tracker.hpp"
#include "support.hpp"
#include "tensorboard_reader.hpp"

namespace {

using namespace accel_test;
using gloo_accelerator = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;

}  // namespace

TEST_CASE("trackers live on the main process: the others write nothing and never read a tensor metric", "[tracking]") {
  const auto dir = accel_test::job_directory("accel_tracking_");
  gloo_accelerator acc(
      accel::options{.project = {.project_dir = dir.string()},
                     .log_with = {accel::tracker::csv, accel::tracker::json_lines, accel::tracker::tensorboard}});
  const int P = acc.num_processes(), r = acc.process_index();
  REQUIRE(P >= 2);
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
  acc.wait_for_everyone();
  CHECK_THROWS_AS(acc.log({{"loss", 1}}), std::logic_error);  // on every process, not only where trackers live

  auto recorder = std::make_shared<accel_test::recording_tracker>();
  acc.init_trackers("run", {{"processes", P}}, {recorder});
  // Off the main process the loss is a meta tensor, whose item() throws: logging it there must not read it.
  const auto loss = r == 0 ? torch::tensor(0.5) : torch::empty({}, torch::kMeta);
  acc.log({{"loss", loss}, {"rank", r}}, 5);
  acc.log({{"loss", 0.25}});  // no step: the number of earlier log calls, 1
  CHECK(acc.get_tracker(accel::tracker::csv).name() == (r == 0 ? "csv" : "blank"));
  acc.end_training();  // finishes, then waits: every file is complete below

  using entry = accel_test::recording_tracker::entry;
  if (r == 0) {
    CHECK(recorder->configs.size() == 1);
    CHECK(recorder->logged == std::vector<entry>{{"loss", 0.5, 5}, {"rank", 0, 5}, {"loss", 0.25, 1}});
    CHECK(recorder->finished == 1);
  } else {
    CHECK(recorder->configs.empty());
    CHECK(recorder->logged.empty());
    CHECK(recorder->finished == 0);
  }
  // One process's records, whichever process reads them (the directory is shared).
  std::set<std::string> files;
  for (const auto& file : accel::detail::directory_entries(dir / "run")) files.insert(file.path().filename().string());
  CHECK(files.size() == 4);
  CHECK(files.count("config.json") == 1);
  CHECK(files.count("metrics.csv") == 1);
  CHECK(files.count("metrics.jsonl") == 1);
  std::ifstream csv(dir / "run" / "metrics.csv");
  std::vector<std::string> rows;
  for (std::string row; std::getline(csv, row);) rows.push_back(row.substr(row.find(',') + 1));  // without wall time
  CHECK(rows == std::vector<std::string>{"step,name,value", "5,loss,0.5", "5,rank,0", "1,loss,0.25"});
  const auto events = tensorboard_reader::read_events(tensorboard_reader::event_file(dir / "run"));
  REQUIRE(events.size() == 4);
  CHECK(events[1].scalars.at(0).tag == "loss");
  CHECK(events[1].scalars.at(0).value == 0.5f);
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
}

TEST_CASE("the progress bar shows on the local main process only", "[tracking]") {
  gloo_accelerator acc;
  std::ostringstream out;
  const std::vector<int> items{1, 2, 3};
  int sum = 0;
  for (int item : acc.progress(items, {.description = "work", .output = &out, .redraw = false})) sum += item;
  CHECK(sum == 6);
  if (acc.is_local_main_process())
    CHECK(out.str().starts_with("work: 3/3 (100%)"));
  else
    CHECK(out.str().empty());
}

TEST_CASE("profile on P processes: each writes profile_{rank}.json with its own events, then waits", "[profile]") {
  gloo_accelerator acc;
  const int P = acc.num_processes(), r = acc.process_index();
  REQUIRE(P >= 2);
  const auto dir = accel_test::job_directory("accel_profile_");
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
  acc.wait_for_everyone();
  const auto pids = acc.gather(torch::tensor({static_cast<std::int64_t>(::getpid())}));
  mlp net(4, 8, 2);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, optimizer);
  {
    auto prof = acc.profile({.record_shapes = true, .output_trace_dir = dir});
    for (int step = 0; step < 2; ++step) {  // process r's batches have 3 + r rows
      opt.zero_grad();
      acc.backward(torch::mse_loss(model(torch::randn({3 + r, 4})), torch::randn({3 + r, 2})));
      opt.step();
    }
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others must wait for its file
    prof.finish();
  }
  // Every process's file is there once finish() returns; each holds that process's events only.
  for (int process = 0; process < P; ++process) {
    INFO("profile_" << process << ".json");
    const auto trace = accel_test::json::parse_file(dir / ("profile_" + std::to_string(process) + ".json"));
    std::set<std::int64_t> rows;
    int operators = 0;
    for (const auto& event : trace.at("traceEvents").items) {
      if (event.at("ph").text != "X" || !event.find("cat") || event.at("cat").text != "cpu_op") continue;
      ++operators;
      CHECK(event.at("pid").number == pids[process].item<std::int64_t>());
      if (event.at("name").text == "aten::addmm")
        rows.insert(static_cast<std::int64_t>(event.at("args").at("Input Dims").items.at(1).items.at(0).number));
    }
    CHECK(operators > 0);
    CHECK(rows == std::set<std::int64_t>{3 + process});
  }
  acc.wait_for_everyone();
  if (acc.is_main_process()) accel::detail::remove_tree(dir);
}
