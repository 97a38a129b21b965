// For tests/scripts/check_mlflow.py: `mlflow_training MODE`, an accelerator logging to the MLflow tracking server at
// MLFLOW_TRACKING_URI (the script's `mlflow server`, or a port where nothing answers).
//   readback  options::log_with = {tracker::mlflow}: a configuration of every kind of value (one too long for
//             MLflow), 2 metrics over 50 steps and 5 at step 100, then end_training. The script reads them back.
//   failing   20 log calls to a server that is not there or never answers; prints how long the slowest log call and
//             end_training took, as JSON.
//   outage    logs steps 0-9, prints "down?" and waits for a line on standard input (the script stops the server),
//             logs 10-19, prints "up?" and waits (it restarts it), logs 20-29, ends, prints "run_id ID".
//   slow      options::log_with = {tracker::mlflow} with the default bounds (MLflow's variables may set them): a
//             param and 30 steps logged at once, then end_training; prints how long end_training took, as JSON.
// The explicit trackers (failing, outage) have bounds short enough for a test; ACCEL_MLFLOW_FINISH_MS sets
// end_training's.
#include <accel/tracking.hpp>

#include "accel_headers.hpp"
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

namespace programs::mlflow_training {

namespace {

accel::mlflow_settings test_settings(const std::string& experiment) {
  auto settings = accel::mlflow_settings::from_environment(experiment);
  settings.connect_timeout = std::chrono::milliseconds(500);
  settings.response_timeout = std::chrono::milliseconds(1000);
  settings.max_backoff = std::chrono::milliseconds(250);
  const char* finish = std::getenv("ACCEL_MLFLOW_FINISH_MS");
  settings.finish_timeout = std::chrono::milliseconds(finish ? std::atoi(finish) : 2000);
  return settings;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void readback(const char* project_dir) {
  accel::accelerator<> acc(
      {.cpu = true, .project = {.project_dir = project_dir}, .log_with = {accel::tracker::mlflow}});
  accel::hyperparameters config = {{"lr", 0.001},
                                   {"batch_size", 32},
                                   {"optimizer", "adamw"},
                                   {"shuffle", true},
                                   {"weight_decay", 1e-5},
                                   {"epochs", 3.0},
                                   {"big", 1e16},
                                   {"fits", std::string(6000, 'x')},
                                   {"too_long", std::string(6001, 'y')}};
  for (int i = 0; i < 120; ++i) config.push_back({"p" + std::to_string(i), i * 7});  // more than a batch of 100
  acc.init_trackers("accel-project", config);
  for (int step = 0; step < 50; ++step) acc.log({{"loss", 1.0 / (step + 1)}, {"lr", 0.001 * step}}, step);
  acc.log({{"train/accuracy", 0.875},
           {"count", 42},
           {"loss", torch::tensor(0.125, torch::kFloat64)},
           {"tiny", 2.5e-300},
           {"third", 1.0 / 3}},
          100);
  acc.end_training();
}

void failing() {
  auto tracker = std::make_shared<accel::mlflow_tracker>(test_settings("failures"));
  accel::accelerator<> acc({.cpu = true});
  acc.init_trackers("failures", {{"lr", 0.1}}, {tracker});
  double slowest_log = 0;
  for (int step = 0; step < 20; ++step) {
    const auto start = std::chrono::steady_clock::now();
    acc.log({{"loss", 1.0 / (step + 1)}}, step);
    slowest_log = std::max(slowest_log, seconds_since(start));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto start = std::chrono::steady_clock::now();
  acc.end_training();
  std::cout << "{\"slowest_log\": " << slowest_log << ", \"end_training\": " << seconds_since(start) << "}"
            << std::endl;
}

void slow(const char* project_dir) {
  accel::accelerator<> acc(
      {.cpu = true, .project = {.project_dir = project_dir}, .log_with = {accel::tracker::mlflow}});
  acc.init_trackers("slow", {{"lr", 0.1}});
  for (int step = 0; step < 30; ++step) acc.log({{"loss", 1.0 / (step + 1)}}, step);
  const auto start = std::chrono::steady_clock::now();
  acc.end_training();
  std::cout << "{\"end_training\": " << seconds_since(start) << "}" << std::endl;
}

void outage() {
  auto tracker = std::make_shared<accel::mlflow_tracker>(test_settings("outage"));
  accel::accelerator<> acc({.cpu = true});
  acc.init_trackers("outage", {}, {tracker});
  std::string line;
  for (int step = 0; step < 30; ++step) {
    if (step == 10 || step == 20) {
      std::cout << (step == 10 ? "down?" : "up?") << std::endl;
      std::getline(std::cin, line);
    }
    acc.log({{"loss", 1.0 / (step + 1)}}, step);
  }
  acc.end_training();
  std::cout << "run_id " << tracker->run_id() << std::endl;
}

}  // namespace

int run(int argc, char** argv) {
  const std::string_view mode = argc == 3 ? argv[1] : "";
  if (mode == "readback") {
    readback(argv[2]);
  } else if (mode == "failing") {
    failing();
  } else if (mode == "outage") {
    outage();
  } else if (mode == "slow") {
    slow(argv[2]);
  } else {
    std::fprintf(stderr, "usage: mlflow_training readback|failing|outage|slow PROJECT_DIR\n");
    return 2;
  }
  return 0;
}

}  // namespace programs::mlflow_training
