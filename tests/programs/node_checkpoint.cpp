// For tests/scripts/save_on_each_node.py and check_cluster.py: a job of 2 nodes of 2 Gloo processes (two
// `accel launch --nnodes 2`, on one machine in two working directories, or on two machines of the namespace cluster,
// tests/scripts/cluster.py), or the same job on one node of 4 processes.
//   node_checkpoint [POLICY] save DIR [on_each_node] [sharded] [async]
//           5 training steps (dropout, AdamW, a scheduler, a shuffled loader), then save_state(DIR), with
//           options::project.save_on_each_node when `on_each_node` is given, in the sharded format
//           (state_dict_type::sharded) when `sharded` is, written in the background when `async` is (then waited for
//           with accel::wait_for_checkpoint).
//   node_checkpoint [POLICY] resume DIR [sharded]
//           10 uninterrupted steps, and load_state(DIR) into objects built from another seed followed by 5 steps;
//           both must end with the same parameters, bit for bit.
//   node_checkpoint [POLICY] loaded DIR FILE
//           load_state(DIR) into objects built from another seed, then the main process writes the full parameters
//           to FILE (safetensors): what a checkpoint made under another number of processes loads as.
//   node_checkpoint [POLICY] latest PROJECT_DIR stop|resume [on_each_node]
//           checkpoint_automatically's resume::latest, an automatic checkpoint every 2 steps under PROJECT_DIR:
//           `stop` trains 7 steps and ends (checkpoint_0..2 saved); `resume` trains 10 uninterrupted steps, and a run
//           built from another seed, which resumes by itself from the newest checkpoint complete on every process,
//           up to step 10: both must end with the same parameters, bit for bit.
//   node_checkpoint [POLICY] latest PROJECT_DIR lose_in_save on_each_node
//           the same checkpoints as `stop`, in a run that goes on until it is stopped (collective timeout 600 s), whose
//           save of checkpoint_2 takes 3 s more on each machine, announced by each writer ("saving checkpoint_2"):
//           for cluster.machine_lost.during_save, where a machine vanishes then; `resume` afterwards must pass over
//           the checkpoint_2.partial left on each disk and resume from checkpoint_1.
//   node_checkpoint [POLICY] train FILE
//           10 training steps, then the main process writes the full parameters to FILE (safetensors): the same
//           bytes whichever machines the processes are on, when the collectives reduce in the same order.
//   node_checkpoint [POLICY] paced FILE
//           40 training steps, a step every 50 ms, each printed, then the main process writes the full parameters to
//           FILE: a job that is still running when a test cuts or slows a link mid-run (train's 10 steps end too soon).
//   node_checkpoint [POLICY] long
//           a run that goes on until it is stopped (a step every 20 ms, each printed), with a collective timeout of
//           600 s: for the machine_lost tests, where a surviving process must be stopped by its launcher's
//           heartbeat, long before a collective gives up.
//   node_checkpoint [POLICY] restarts PROJECT_DIR FILE FAILING_ATTEMPTS
//           for `accel launch --max_restarts` across machines (cluster.restart.*): 10 steps with resume::latest, a
//           checkpoint every 2 steps saved on each node; in each attempt below FAILING_ATTEMPTS (ACCEL_RESTART_COUNT),
//           process 3 kills itself (SIGKILL) after step 5 while the others compute for 2 s more (outside any
//           collective). Each process says where its attempt started; the main
//           process writes the full parameters to FILE at the end, which must not depend on the restarts.
//   node_checkpoint [POLICY] elastic PROJECT_DIR FILE [FAILING_ATTEMPT [shared]]
//           for an elastic job (cluster.elastic.*): 30 steps, a step every 100 ms, each printed, with resume::latest
//           and a checkpoint every 2 steps saved on each node; each process says where its attempt started and in a
//           world of how many processes; the main process writes the full parameters to FILE at the end. In attempt
//           FAILING_ATTEMPT (ACCEL_RESTART_COUNT), process 1 kills itself after step 20 while the others compute 2 s.
//           With `shared`, PROJECT_DIR is on a disk every machine sees: the main process saves (no save_on_each_node).
// POLICY is data_parallel (the default), zero2 or fully_sharded, over Gloo. Every process prints one line saying what
// it did (or the checkpoint_error it got) and exits non-zero on failure.
#include "accel_headers.hpp"
#include <torch/torch.h>

#include "support.hpp"

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace programs::node_checkpoint {

namespace {

constexpr const char* usage =
    "usage: node_checkpoint [data_parallel|zero2|fully_sharded|hybrid_sharded] save DIR [on_each_node] [sharded] "
    "[async] | ... "
    "resume DIR "
    "[sharded] | ... loaded DIR FILE | ... train FILE | ... paced FILE | ... latest PROJECT_DIR "
    "stop|resume|lose_in_save [on_each_node] | ... long | ... restarts PROJECT_DIR FILE FAILING_ATTEMPTS | "
    "... elastic PROJECT_DIR FILE [FAILING_ATTEMPT [shared]]\n";

template <class Accelerator>
int save(const std::filesystem::path& directory, const accel::options& options, bool asynchronous) {
  accel_test::resumable_run<Accelerator> first_part(1, 64, options);
  first_part.train(5);
  const int rank = first_part.acc.process_index();
  try {
    first_part.acc.save_state(directory, {.asynchronous = asynchronous});
    if (asynchronous) (void)accel::wait_for_checkpoint(first_part.acc);
  } catch (const accel::checkpoint_error& e) {
    std::printf("node_checkpoint: rank %d save failed: %s\n", rank, e.what());
    std::fflush(stdout);
    // The save failed on every process together, so they can still meet: all have printed before any exits (the
    // launcher ends the others at the first exit).
    first_part.acc.wait_for_everyone();
    return 3;
  }
  std::printf("node_checkpoint: rank %d saved\n", rank);
  return 0;
}

template <class Accelerator>
int resume(const std::filesystem::path& directory, const accel::options& options) {
  accel_test::resumable_run<Accelerator> uninterrupted(1, 64, options);
  uninterrupted.train(10);
  accel_test::resumable_run<Accelerator> resumed(99, 64, options);
  const int rank = resumed.acc.process_index();
  try {
    resumed.acc.load_state(directory);
  } catch (const accel::checkpoint_error& e) {
    std::printf("node_checkpoint: rank %d load failed: %s\n", rank, e.what());
    std::fflush(stdout);
    return 3;
  }
  resumed.train(5);
  // Under fully_sharded each process holds slices: the full parameters are compared (get_state_dict gathers them).
  const auto got = resumed.acc.get_state_dict(resumed.model);
  const auto expected = uninterrupted.acc.get_state_dict(uninterrupted.model);
  bool same = got.size() == expected.size();
  for (std::size_t i = 0; same && i < got.size(); ++i) same = torch::equal(got[i].second, expected[i].second);
  std::printf("node_checkpoint: rank %d resumed %s\n", rank, same ? "bit for bit" : "with other parameters");
  std::fflush(stdout);
  return same ? 0 : 1;
}

template <class Accelerator>
int loaded(const std::filesystem::path& directory, const std::filesystem::path& file, const accel::options& options) {
  accel_test::resumable_run<Accelerator> run(99, 64, options);
  run.acc.load_state(directory);
  const auto state = run.acc.get_state_dict(run.model);  // a collective under the sharded policies
  if (run.acc.is_main_process()) accel::safetensors::save(file, state);
  std::printf("node_checkpoint: rank %d loaded\n", run.acc.process_index());
  std::fflush(stdout);
  return 0;
}

/// Registered by the `latest` runs, so that their checkpoints hold a registered object: counts the saves, and with
/// `slow` makes the third (checkpoint_2) take 3 s, said by each process that writes it, to give a test the moment.
struct save_marker {
  int rank = 0;
  bool slow = false;
  mutable std::int64_t saves = 0;
  void save(torch::serialize::OutputArchive& archive) const {
    archive.write("saves", c10::IValue(++saves));
    if (!slow || saves != 3) return;
    std::printf("node_checkpoint: rank %d saving checkpoint_2\n", rank);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
  void load(torch::serialize::InputArchive& archive) {
    c10::IValue value;
    archive.read("saves", value);
    saves = value.toInt();
  }
};

/// An automatic checkpoint every 2 steps, and resume::latest.
constexpr accel::automatic_checkpoint_options every_two_steps{.every_steps = 2, .resume = accel::resume::latest};

template <class Accelerator>
int lose_in_save(accel::options options) {
  options.timeout = std::chrono::seconds(600);  // the launchers' heartbeat, not a collective, must end a survivor
  accel_test::resumable_run<Accelerator> run(1, 64, options, every_two_steps);
  save_marker marker{run.acc.process_index(), /*slow=*/true};
  run.acc.register_for_checkpointing(marker);
  // The loop of train(), each step printed: the automatic save due at a step is made when the loader moves on.
  for (int step = 1; step <= 100'000;) {
    for (auto&& [x, y] : run.batches) {
      run.acc.backward(torch::mse_loss(run.model(x), y));
      run.opt.step();
      run.sched.step();
      run.opt.zero_grad();
      std::printf("node_checkpoint: rank %d step %d\n", run.acc.process_index(), step++);
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return 0;
}

template <class Accelerator>
int latest(const std::filesystem::path& project_dir, std::string_view phase, const accel::options& plain) {
  auto options = plain;
  options.project.project_dir = project_dir.string();
  options.project.automatic_checkpoint_naming = true;
  if (phase == "lose_in_save") return lose_in_save<Accelerator>(options);
  if (phase == "stop") {
    accel_test::resumable_run<Accelerator> stopped(1, 64, options, every_two_steps);
    save_marker marker{stopped.acc.process_index()};
    stopped.acc.register_for_checkpointing(marker);
    stopped.train(7);
    std::printf("node_checkpoint: rank %d stopped at step %lld\n", stopped.acc.process_index(),
                static_cast<long long>(stopped.acc.completed_steps()));
    return 0;
  }
  accel_test::resumable_run<Accelerator> uninterrupted(1, 64, plain);
  uninterrupted.train(10);
  accel_test::resumable_run<Accelerator> resumed(99, 64, options, every_two_steps);
  const int rank = resumed.acc.process_index();
  save_marker marker{rank};
  resumed.acc.register_for_checkpointing(marker);
  try {
    resumed.train_until(10);  // the first pass loads the agreed checkpoint
  } catch (const accel::checkpoint_error& e) {
    std::printf("node_checkpoint: rank %d resume failed: %s\n", rank, e.what());
    std::fflush(stdout);
    resumed.acc.wait_for_everyone();  // every process prints before any exits (the launcher then ends the others)
    return 3;
  }
  const auto got = resumed.acc.get_state_dict(resumed.model);
  const auto expected = uninterrupted.acc.get_state_dict(uninterrupted.model);
  bool same = got.size() == expected.size();
  for (std::size_t i = 0; same && i < got.size(); ++i) same = torch::equal(got[i].second, expected[i].second);
  const auto& from = resumed.acc.resumed_from();
  std::printf("node_checkpoint: rank %d resumed from %s %s\n", rank, from ? from->filename().c_str() : "nothing",
              same ? "bit for bit" : "with other parameters");
  std::fflush(stdout);
  return same ? 0 : 1;
}

template <class Accelerator>
int restarts(const std::filesystem::path& project_dir, const std::filesystem::path& file, int failing_attempts) {
  accel::options options{.cpu = true, .timeout = std::chrono::seconds(60)};
  options.project = {
      .project_dir = project_dir.string(), .automatic_checkpoint_naming = true, .save_on_each_node = true};
  const char* restart_count = std::getenv("ACCEL_RESTART_COUNT");
  const int attempt = restart_count != nullptr ? std::atoi(restart_count) : 0;
  accel_test::resumable_run<Accelerator> run(1, 64, options, every_two_steps);
  const int rank = run.acc.process_index();
  bool announced = false;
  while (run.acc.completed_steps() < 10)
    for (auto&& [x, y] : run.batches) {
      if (!announced) {  // the first pass's begin() has loaded the newest checkpoint, if any
        announced = true;
        const auto& from = run.acc.resumed_from();
        std::printf("node_checkpoint: rank %d attempt %d started at step %lld from %s\n", rank, attempt,
                    static_cast<long long>(run.acc.completed_steps()), from ? from->filename().c_str() : "nothing");
        std::fflush(stdout);
      }
      if (attempt < failing_attempts && run.acc.completed_steps() == 5) {
        if (rank == 3) {
          std::printf("node_checkpoint: rank 3 attempt %d kills itself after step 5\n", attempt);
          std::fflush(stdout);
          raise(SIGKILL);
        }
        // The others compute meanwhile (outside any collective): the launchers hear of process 3 before any of them
        // fails on its closed connections, so that the failure named is always process 3's.
        std::this_thread::sleep_for(std::chrono::seconds(2));
      }
      run.acc.backward(torch::mse_loss(run.model(x), y));
      run.opt.step();
      run.sched.step();
      run.opt.zero_grad();
      if (run.acc.completed_steps() == 10) break;
    }
  const auto state = run.acc.get_state_dict(run.model);
  if (run.acc.is_main_process()) accel::safetensors::save(file, state);
  return 0;
}

template <class Accelerator>
int elastic(const std::filesystem::path& project_dir, const std::filesystem::path& file, int failing_attempt,
            bool shared_disk) {
  accel::options options{.cpu = true, .timeout = std::chrono::seconds(60)};
  options.project = {
      .project_dir = project_dir.string(), .automatic_checkpoint_naming = true, .save_on_each_node = !shared_disk};
  const char* restart_count = std::getenv("ACCEL_RESTART_COUNT");
  const int attempt = restart_count != nullptr ? std::atoi(restart_count) : 0;
  accel_test::resumable_run<Accelerator> run(1, 64, options, every_two_steps);
  const int rank = run.acc.process_index();
  bool announced = false;
  while (run.acc.completed_steps() < 30)
    for (auto&& [x, y] : run.batches) {
      if (!announced) {  // the first pass's begin() has loaded the newest checkpoint, if any
        announced = true;
        const auto& from = run.acc.resumed_from();
        std::printf("node_checkpoint: rank %d attempt %d world %d started at step %lld from %s\n", rank, attempt,
                    run.acc.num_processes(), static_cast<long long>(run.acc.completed_steps()),
                    from ? from->filename().c_str() : "nothing");
      }
      if (attempt == failing_attempt && run.acc.completed_steps() == 20) {
        if (rank == 1) raise(SIGKILL);
        std::this_thread::sleep_for(std::chrono::seconds(2));  // outside any collective: process 1 is the one named
      }
      run.acc.backward(torch::mse_loss(run.model(x), y));
      run.opt.step();
      run.sched.step();
      run.opt.zero_grad();
      std::printf("node_checkpoint: rank %d step %lld\n", rank, static_cast<long long>(run.acc.completed_steps()));
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (run.acc.completed_steps() == 30) break;
    }
  const auto state = run.acc.get_state_dict(run.model);
  if (run.acc.is_main_process()) accel::safetensors::save(file, state);
  return 0;
}

template <class Accelerator>
int train(const std::filesystem::path& file, const accel::options& options, bool paced) {
  accel_test::resumable_run<Accelerator> run(1, 64, options);
  if (!paced) run.train(10);
  for (int step = 1; paced && step <= 40; ++step) {
    run.train(1);
    std::printf("node_checkpoint: rank %d step %d\n", run.acc.process_index(), step);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto state = run.acc.get_state_dict(run.model);  // a collective under fully_sharded: every process calls it
  if (run.acc.is_main_process()) accel::safetensors::save(file, state);
  std::printf("node_checkpoint: rank %d trained\n", run.acc.process_index());
  std::fflush(stdout);
  return 0;
}

template <class Accelerator>
int train_until_stopped() {
  accel_test::resumable_run<Accelerator> run(1, 64, {.cpu = true, .timeout = std::chrono::seconds(600)});
  for (int step = 1; step <= 100'000; ++step) {
    run.train(1);
    std::printf("node_checkpoint: rank %d step %d\n", run.acc.process_index(), step);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

template <class Policy>
int run_mode(std::string_view mode, const std::vector<std::string>& args) {
  using accelerator = accel::accelerator<accel::fp32, Policy>;
  if (mode == "long") return args.size() == 1 ? train_until_stopped<accelerator>() : (std::fputs(usage, stderr), 2);
  if (mode == "elastic") {
    if (args.size() < 3 || args.size() > 5 || (args.size() == 5 && args[4] != "shared"))
      return std::fputs(usage, stderr), 2;
    return elastic<accelerator>(args[1], args[2], args.size() >= 4 ? std::atoi(args[3].c_str()) : -1, args.size() == 5);
  }
  if (mode == "restarts") {
    if (args.size() != 4) return std::fputs(usage, stderr), 2;
    return restarts<accelerator>(args[1], args[2], std::atoi(args[3].c_str()));
  }
  const bool with_phase = mode == "latest";  // latest PROJECT_DIR stop|resume [on_each_node]
  const std::size_t fixed = with_phase || mode == "loaded" ? 3 : 2;
  const std::vector<std::string> flags(args.begin() + static_cast<std::ptrdiff_t>(std::min(fixed, args.size())),
                                       args.end());
  const auto given = [&](std::string_view flag) { return std::find(flags.begin(), flags.end(), flag) != flags.end(); };
  const bool on_each_node = given("on_each_node"), sharded = given("sharded"), asynchronous = given("async");
  const bool flags_fit = (mode == "save" || mode == "latest" || !on_each_node) &&
                         (mode == "save" || mode == "resume" || !sharded) && (mode == "save" || !asynchronous) &&
                         flags.size() == static_cast<std::size_t>(on_each_node) + static_cast<std::size_t>(sharded) +
                                             static_cast<std::size_t>(asynchronous);
  if (args.size() < fixed || !flags_fit ||
      (with_phase && args[2] != "stop" && args[2] != "resume" && args[2] != "lose_in_save")) {
    std::fputs(usage, stderr);
    return 2;
  }
  // A process left alone (its peer failed) gives up within a minute instead of the default half hour.
  accel::options options{
      .cpu = true, .timeout = std::chrono::seconds(60), .project = {.save_on_each_node = on_each_node}};
  if (sharded) options.sharding.state_dict = accel::state_dict_type::sharded;
  if (mode == "save") return save<accelerator>(args[1], options, asynchronous);
  if (mode == "resume") return resume<accelerator>(args[1], options);
  if (mode == "loaded") return loaded<accelerator>(args[1], args[2], options);
  if (mode == "latest") return latest<accelerator>(args[1], args[2], options);
  return train<accelerator>(args[1], options, mode == "paced");
}

}  // namespace

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string policy = "data_parallel";
  if (!args.empty() &&
      (args[0] == "data_parallel" || args[0] == "zero2" || args[0] == "fully_sharded" || args[0] == "hybrid_sharded")) {
    policy = args[0];
    args.erase(args.begin());
  }
  const std::string mode = args.empty() ? "" : args[0];
  if (mode != "save" && mode != "resume" && mode != "loaded" && mode != "train" && mode != "latest" && mode != "long" &&
      mode != "paced" && mode != "restarts" && mode != "elastic") {
    std::fputs(usage, stderr);
    return 2;
  }
  if (policy == "zero2") return run_mode<accel::zero2<accel::gloo>>(mode, args);
  if (policy == "fully_sharded") return run_mode<accel::fully_sharded<accel::gloo>>(mode, args);
  // Its mesh from the launcher (--parallelism_config_dp_replicate_size, --parallelism_config_dp_shard_size).
  if (policy == "hybrid_sharded") return run_mode<accel::hybrid_sharded<accel::gloo>>(mode, args);
  return run_mode<accel::data_parallel<accel::gloo>>(mode, args);
}

}  // namespace programs::node_checkpoint
