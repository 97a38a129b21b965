// Model weights in safetensors: round trips of every dtype, sharding with an index, validation of what is read
// (truncated, corrupt, mismatching files leave the model unchanged). The Python side (numpy reads accel's file,
// accel reads Python's) is tests/scripts/checkpoint_interop.cmake.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support.hpp"
#include "support/resident.hpp"

namespace {

std::filesystem::path scratch(const std::string& name) { return accel_test::scratch_directory("checkpoint_" + name); }

}  // namespace

TEST_CASE("safetensors round trip: every dtype, any layout, exact bytes", "[checkpoint]") {
  const auto dir = scratch("dtypes");
  accel::safetensors::tensor_list tensors = {{"f64", torch::randn({3, 2}, torch::kDouble)},
                                             {"f32.transposed", torch::randn({4, 3}).t()},
                                             {"f16", torch::randn({5}).to(torch::kHalf)},
                                             {"bf16", torch::randn({2, 2}).to(torch::kBFloat16)},
                                             {"i64", torch::arange(6).reshape({2, 3})},
                                             {"i32", torch::arange(4, torch::kInt)},
                                             {"i8", torch::tensor({-3, 4}, torch::kChar)},
                                             {"u8", torch::tensor({250, 1}, torch::kByte)},
                                             {"bool", torch::tensor({true, false, true})},
                                             {"scalar", torch::scalar_tensor(7.5)},
                                             {"empty", torch::zeros({0, 3})},
                                             {"name with \"quotes\"", torch::ones({1})}};
  accel::safetensors::save(dir / "t.safetensors", tensors, {{"format", "pt"}, {"note", "accel"}});
  std::map<std::string, std::string> metadata;
  auto loaded = accel::safetensors::load(dir / "t.safetensors", &metadata);
  REQUIRE(loaded.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CHECK(loaded[i].first == tensors[i].first);
    CHECK(loaded[i].second.scalar_type() == tensors[i].second.scalar_type());
    CHECK(torch::equal(loaded[i].second, tensors[i].second));
  }
  CHECK(metadata.at("note") == "accel");
  CHECK_FALSE(std::filesystem::exists(dir / "t.safetensors.tmp"));  // written to a temporary, then renamed
  accel::detail::remove_tree(dir);
}

TEST_CASE("safetensors: truncated and corrupt files are named with the problem", "[checkpoint]") {
  const auto dir = scratch("corrupt");
  accel::safetensors::save(dir / "good.safetensors", {{"w", torch::randn({16})}});
  std::ifstream in(dir / "good.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir / name, std::ios::binary) << content;
    return dir / name;
  };
  using Catch::Contains;
  CHECK_THROWS_WITH(accel::safetensors::load(write("short.safetensors", bytes.substr(0, bytes.size() - 4))),
                    Contains("truncated or corrupt") && Contains("lie outside the file"));
  CHECK_THROWS_WITH(accel::safetensors::load(write("tiny.safetensors", "abc")), Contains("shorter than the 8-byte"));
  std::string huge_header = bytes;
  huge_header[5] = '\x7f';
  CHECK_THROWS_WITH(accel::safetensors::load(write("header.safetensors", huge_header)), Contains("its header claims"));
  std::string bad_json = bytes;
  bad_json[8] = '[';
  CHECK_THROWS_WITH(accel::safetensors::load(write("json.safetensors", bad_json)),
                    Contains("not a valid safetensors file"));
  std::string bad_dtype = bytes;
  bad_dtype.replace(bad_dtype.find("F32"), 3, "F99");
  CHECK_THROWS_WITH(accel::safetensors::load(write("dtype.safetensors", bad_dtype)), Contains("unknown dtype F99"));
  CHECK_THROWS_WITH(accel::safetensors::load(dir / "missing.safetensors"), Contains("cannot open"));
  accel::detail::remove_tree(dir);
}

TEST_CASE("save_model / load_model: names, sharding with an index, validation before any change", "[checkpoint]") {
  const auto dir = scratch("model");
  torch::manual_seed(1);
  auto net = accel_test::mlp(4, 8, 2);
  auto bn = torch::nn::BatchNorm1d(3);
  bn->running_mean.fill_(0.5);
  accel::save_model(*net, dir / "single");
  CHECK(std::filesystem::exists(dir / "single" / "model.safetensors"));
  // Sharded: each tensor of the MLP is over 30 bytes, so a 100-byte limit gives several files and an index.
  accel::save_model(*net, dir / "sharded", 100);
  CHECK(std::filesystem::exists(dir / "sharded" / "model.safetensors.index.json"));
  CHECK(std::filesystem::exists(dir / "sharded" / "model-00001-of-00003.safetensors"));
  CHECK_FALSE(std::filesystem::exists(dir / "sharded" / "model.safetensors"));
  for (const char* where : {"single", "sharded"}) {
    torch::manual_seed(2);
    auto other = accel_test::mlp(4, 8, 2);
    REQUIRE_FALSE(accel_test::bitwise_equal(*other, *net));
    accel::load_model(*other, dir / where);
    CHECK(accel_test::bitwise_equal(*other, *net));
  }
  accel::save_model(*bn, dir / "bn");
  auto bn2 = torch::nn::BatchNorm1d(3);
  accel::load_model(*bn2, dir / "bn");
  CHECK(torch::equal(bn2->running_mean, bn->running_mean));  // buffers too
  // A model of another shape: a clear error, and nothing changed.
  auto wider = accel_test::mlp(4, 9, 2);
  auto before = wider->parameters()[0].clone();
  CHECK_THROWS_WITH(accel::load_model(*wider, dir / "single"),
                    Catch::Contains("do not fit this model; nothing was loaded") && Catch::Contains("fc1.weight"));
  CHECK(torch::equal(wider->parameters()[0], before));
  CHECK_THROWS_WITH(accel::load_model(*bn2, dir / "single"),
                    Catch::Contains("missing: weight") && Catch::Contains("unexpected: fc1.weight"));
  accel::detail::remove_tree(dir);
}

namespace {
using training_run = accel_test::resumable_run<accel::accelerator<>>;
}  // namespace

TEST_CASE("resume: 10 steps == 5, save, load into other objects, 5 more, bit for bit", "[checkpoint][resume]") {
  const auto dir = scratch("resume");
  training_run uninterrupted(1, 32);
  uninterrupted.train(10);  // 8 batches per epoch: the save below falls mid-epoch
  std::vector<torch::Tensor> at_save;
  double lr_at_save = 0;
  {
    training_run first_half(1, 32);
    first_half.train(5);
    first_half.acc.save_state(dir / "state");
    for (auto& p : first_half.net->parameters()) at_save.push_back(p.clone());
    lr_at_save = first_half.optimizer.param_groups()[0].options().get_lr();
  }
  CHECK_FALSE(std::filesystem::exists(dir / "state.partial"));
  training_run resumed(99, 32);  // other weights, another RNG state
  REQUIRE_FALSE(accel_test::bitwise_equal(*resumed.net, *uninterrupted.net));
  resumed.acc.load_state(dir / "state");
  for (std::size_t i = 0; i < at_save.size(); ++i) CHECK(torch::equal(resumed.net->parameters()[i], at_save[i]));
  CHECK(resumed.optimizer.param_groups()[0].options().get_lr() == lr_at_save);
  resumed.train(5);
  CHECK(accel_test::bitwise_equal(*resumed.net, *uninterrupted.net));
  CHECK(resumed.schedule.steps() == uninterrupted.schedule.steps());
  CHECK(resumed.batches.position().epoch == uninterrupted.batches.position().epoch);
  accel::detail::remove_tree(dir);
}

TEST_CASE(
    "save_state with safe_serialization = false writes Accelerate's pytorch_model.bin (a pickled dict), which "
    "loads and resumes bit for bit, merges, and replaces model.safetensors in the same directory",
    "[checkpoint][resume]") {
  const auto dir = scratch("pickled");
  training_run uninterrupted(1, 32);
  uninterrupted.train(10);
  {
    training_run first_half(1, 32);
    first_half.train(5);
    first_half.acc.save_state(dir / "state");  // safetensors first: the next save must replace it
    first_half.acc.save_state(dir / "state", {.safe_serialization = false});
    const auto pickled = accel::detail::unpickle_tensors(
        accel::detail::read_checkpoint_file(dir / "state", "pytorch_model.bin", std::nullopt), "pytorch_model.bin");
    const auto expected = first_half.acc.get_state_dict(first_half.model);
    REQUIRE(pickled.size() == expected.size());
    for (std::size_t i = 0; i < pickled.size(); ++i) {
      CHECK(pickled[i].first == expected[i].first);
      CHECK(torch::equal(pickled[i].second, expected[i].second));
    }
  }
  CHECK(std::filesystem::exists(dir / "state" / "pytorch_model.bin"));
  CHECK_FALSE(std::filesystem::exists(dir / "state" / "model.safetensors"));
  training_run resumed(99, 32);
  resumed.acc.load_state(dir / "state");
  resumed.train(5);
  CHECK(accel_test::bitwise_equal(*resumed.net, *uninterrupted.net));
  const auto merged = accel::merge_weights(dir / "state", dir / "merged");  // the full weights as safetensors
  REQUIRE(merged == std::vector<std::filesystem::path>{dir / "merged" / "model.safetensors"});
  CHECK(accel::safetensors::load(merged[0]).size() == resumed.net->parameters().size() + resumed.net->buffers().size());
  std::ofstream(dir / "state" / "pytorch_model.bin", std::ios::binary | std::ios::app) << "x";  // damaged
  CHECK_THROWS_AS(resumed.acc.load_state(dir / "state"), accel::checkpoint_error);
  resumed.acc.save_state(dir / "state");  // safetensors again: the pickled file is accel's, and goes
  CHECK(std::filesystem::exists(dir / "state" / "model.safetensors"));
  CHECK_FALSE(std::filesystem::exists(dir / "state" / "pytorch_model.bin"));
  accel::detail::remove_tree(dir);
}

namespace {
constexpr int epochs = 3, steps_per_epoch = 3;  // 10 samples, batch 4: batches of 4, 4 and 2

/// The epoch loop of Accelerate's checkpointing.py: epochs [first_epoch, 3), one pass each; with `skip`, the first
/// pass skips that many batches (its `skip_first_batches`). Saves into `save_to` after `stop_after` steps and stops.
void train_epochs(training_run& run, std::int64_t first_epoch, std::size_t skip, int stop_after = -1,
                  const std::filesystem::path& save_to = {}) {
  int done = 0;
  for (auto epoch = first_epoch; epoch < epochs; ++epoch) {
    if (epoch == first_epoch && skip > 0) run.batches.skip_first_batches(skip);
    for (auto&& [x, y] : run.batches) {
      run.acc.backward(torch::mse_loss(run.model(x), y));
      run.opt.step();
      run.sched.step();
      run.opt.zero_grad();
      if (++done == stop_after) return run.acc.save_state(save_to);
    }
  }
}
}  // namespace

// Issue: a checkpoint taken on an epoch's last batch resumed into an empty rest of that epoch, so a script that
// derives its epoch from the step count (as Accelerate's checkpointing.py) replayed the previous epoch's order or,
// without skip_first_batches, trained nothing in its first pass. Resumed from every step of 3 epochs, both ways.
TEST_CASE("resume from every step of a 3-epoch run, epoch ends included, equals the uninterrupted run",
          "[checkpoint][resume]") {
  const auto dir = scratch("resume-every-step");
  training_run uninterrupted(1, 10);
  train_epochs(uninterrupted, 0, 0);
  for (int saved_after = 1; saved_after <= epochs * steps_per_epoch; ++saved_after) {
    for (const bool with_skip : {false, true}) {
      INFO("saved after step " << saved_after << (with_skip ? ", resumed with skip_first_batches" : ""));
      {
        training_run first_part(1, 10);
        train_epochs(first_part, 0, 0, saved_after, dir / "state");
      }
      training_run resumed(99, 10);
      resumed.acc.load_state(dir / "state");
      const int starting_epoch = saved_after / steps_per_epoch;  // Accelerate's recipe: from the step count
      const int resume_step = saved_after - starting_epoch * steps_per_epoch;
      CHECK(resumed.batches.position().epoch == starting_epoch);  // accel's recipe: read it from the range
      CHECK(resumed.batches.position().batch == resume_step - 1);
      train_epochs(resumed, starting_epoch, with_skip ? static_cast<std::size_t>(resume_step) : 0);
      CHECK(accel_test::bitwise_equal(*resumed.net, *uninterrupted.net));
      CHECK(resumed.schedule.steps() == uninterrupted.schedule.steps());
    }
  }
  accel::detail::remove_tree(dir);
}

TEST_CASE("load_state refuses a checkpoint that does not fit, before changing anything", "[checkpoint][resume]") {
  const auto dir = scratch("refuse");
  training_run saved(1, 32);
  saved.train(3);
  saved.acc.save_state(dir / "state");
  training_run target(7, 32);
  const auto before = target.net->parameters()[0].clone();
  using Catch::Contains;
  CHECK_THROWS_WITH(target.acc.load_state(dir / "nowhere"), Contains("no checkpoint at"));
  accel_test::copy_tree(dir / "state", dir / "corrupt");
  std::ofstream(dir / "corrupt" / "optimizer.bin", std::ios::trunc) << "garbage";
  CHECK_THROWS_WITH(
      target.acc.load_state(dir / "corrupt"),
      Contains("optimizer.bin is damaged: its 7 bytes differ from the") && Contains("nothing was loaded"));
  std::filesystem::remove(dir / "corrupt" / "accel_checksums.txt");  // unverified: LibTorch's reader says so
  CHECK_THROWS_WITH(target.acc.load_state(dir / "corrupt", {.allow_unchecked = true}),
                    Contains("optimizer.bin is truncated or corrupt"));
  accel_test::copy_tree(dir / "state", dir / "missing");
  std::filesystem::remove(dir / "missing" / "random_states_0.bin");
  CHECK_THROWS_WITH(target.acc.load_state(dir / "missing"), Contains("lacks") && Contains("random_states_0.bin"));
  CHECK(torch::equal(target.net->parameters()[0], before));
  // Another model: the weights are checked by name, shape and dtype.
  accel::accelerator<> other{{.cpu = true}};
  auto wider = accel_test::mlp(3, 17, 1);
  torch::optim::AdamW optimizer(wider->parameters());
  accel_test::lambda_lr schedule(optimizer, [](int) { return 1.0; });
  std::vector<std::pair<torch::Tensor, torch::Tensor>> samples{{torch::zeros({3}), torch::zeros({1})}};
  accel::data_loader loader(samples, {.batch_size = 1});
  auto prepared = other.prepare(wider, optimizer, schedule, loader);
  CHECK_THROWS_WITH(other.load_state(dir / "state"), Contains("do not fit the prepared model; nothing was loaded"));
  // A kind of object the program did not prepare (here: no scheduler).
  accel::accelerator<> fewer{{.cpu = true}};
  auto same = accel_test::mlp(3, 16, 1);
  torch::optim::AdamW same_optimizer(same->parameters());
  auto prepared_fewer = fewer.prepare(same, same_optimizer, loader);
  CHECK_THROWS_WITH(fewer.load_state(dir / "state"), Contains("has 1 scheduler, this program 0"));
  accel::detail::remove_tree(dir);
}

TEST_CASE("I2 I3 automatic checkpoint naming: total_limit keeps the newest, load_state() loads the newest",
          "[checkpoint][resume]") {
  const auto dir = scratch("project");
  accel::accelerator<> acc{
      {.cpu = true, .project = {.project_dir = dir.string(), .automatic_checkpoint_naming = true, .total_limit = 2}}};
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  for (int i = 0; i < 11; ++i) {
    torch::NoGradGuard no_grad;
    net->bias.fill_(i);
    CHECK(acc.save_state().filename() == "checkpoint_" + std::to_string(i));
  }
  std::vector<std::string> kept;
  for (const auto& entry : accel::detail::directory_entries(dir / "checkpoints"))
    kept.push_back(entry.path().filename());
  std::sort(kept.begin(), kept.end());
  CHECK(kept == std::vector<std::string>{"checkpoint_10", "checkpoint_9"});
  acc.load_state();
  CHECK(net->bias.item<float>() == 10.0f);
  accel::accelerator<> no_project{{.cpu = true}};
  CHECK_THROWS_WITH(no_project.save_state(), Catch::Contains("automatic_checkpoint_naming"));
  accel::detail::remove_tree(dir);
}

TEST_CASE(
    "checkpoint_automatically saves after every N-th step, restarted with resume::latest, a run ends where an "
    "uninterrupted one does, bit for bit",
    "[checkpoint][resume]") {
  const auto dir = scratch("auto-resume");
  const accel::options options{
      .cpu = true, .project = {.project_dir = dir.string(), .automatic_checkpoint_naming = true, .total_limit = 2}};
  const accel::automatic_checkpoint_options every_three{.every_steps = 3, .resume = accel::resume::latest};
  const auto checkpoints = [&] {
    std::vector<std::string> names;
    for (const auto& [number, path] : accel::detail::numbered_checkpoints(dir / "checkpoints"))
      names.push_back(path.filename().string());
    return names;
  };
  training_run uninterrupted(1, 32);  // 8 batches per epoch, dropout: 20 steps cross two epochs' ends
  uninterrupted.train(20);
  {
    training_run killed(1, 32, options, every_three);
    killed.train_until(10);  // saves after steps 3, 6 and 9, then stops (is killed) after step 10
    CHECK(killed.acc.completed_steps() == 10);
    CHECK_FALSE(killed.acc.resumed_from().has_value());  // nothing to resume from at first
  }
  CHECK(checkpoints() == std::vector<std::string>{"checkpoint_1", "checkpoint_2"});
  training_run restarted(99, 32, options, every_three);  // other weights, another RNG state: all from the checkpoint
  restarted.train_until(20);
  REQUIRE(restarted.acc.resumed_from().has_value());
  CHECK(restarted.acc.resumed_from()->filename() == "checkpoint_2");
  CHECK(accel_test::bitwise_equal(*restarted.net, *uninterrupted.net));
  CHECK(restarted.schedule.steps() == uninterrupted.schedule.steps());
  CHECK(checkpoints() == std::vector<std::string>{"checkpoint_4", "checkpoint_5"});  // after steps 15 and 18
  training_run counted(7, 32,
                       {.cpu = true, .project = {.project_dir = dir.string(), .automatic_checkpoint_naming = true}});
  counted.acc.load_state();
  CHECK(counted.acc.completed_steps() == 18);
  accel::detail::remove_tree(dir);
}

TEST_CASE("redteam 10: load_state keeps no memory from one call to the next (no generator copies left behind)",
          "[checkpoint]") {
  const auto dir = scratch("load-leak");
  accel::accelerator<> acc{{.cpu = true}};
  torch::manual_seed(1);
  accel_test::mlp net(3, 8, 1);
  torch::optim::AdamW optimizer(net->parameters());
  auto [model, opt] = acc.prepare(net, optimizer);
  acc.save_state(dir / "state");
  for (int i = 0; i < 200; ++i) acc.load_state(dir / "state");  // warm-up: the allocator's arenas settle
  const auto before = accel_test::resident_bytes();
  for (int i = 0; i < 1000; ++i) acc.load_state(dir / "state");
  // LibTorch 1.13's Generator::clone() kept about 2.7 kB per load: 2.7 MB here.
  CHECK(accel_test::resident_bytes() - before < 1024 * 1024);
  accel::detail::remove_tree(dir);
}

TEST_CASE(
    "redteam 5: after an incomplete newest checkpoint, resume::latest resumes from the one before, and its next "
    "automatic saves number past the incomplete one, which stays as it was",
    "[checkpoint][resume]") {
  const auto dir = scratch("resume-past-incomplete");
  const accel::options options{.cpu = true,
                               .project = {.project_dir = dir.string(), .automatic_checkpoint_naming = true}};
  const accel::automatic_checkpoint_options every_three{.every_steps = 3, .resume = accel::resume::latest};
  const auto root = dir / "checkpoints";
  training_run uninterrupted(1, 32);
  uninterrupted.train(12);
  {
    training_run killed(1, 32, options, every_three);
    killed.train_until(7);  // saves checkpoint_0 after step 3 and checkpoint_1 after step 6
  }
  // The save after step 9 was cut short: checkpoint_2 holds files but no manifest.
  accel_test::copy_tree(root / "checkpoint_1", root / "checkpoint_2");
  std::filesystem::remove(root / "checkpoint_2" / "accel_checksums.txt");
  const auto left = accel_test::text_of(root / "checkpoint_2" / "random_states_0.bin");
  for (int restart = 0; restart < 2; ++restart) {  // before the fix, every restart failed at its first save
    training_run restarted(99, 32, options, every_three);
    restarted.train_until(12 + 3 * restart);  // saves after step 9, then after step 12
    REQUIRE(restarted.acc.resumed_from().has_value());
    CHECK(restarted.acc.resumed_from()->filename() == (restart == 0 ? "checkpoint_1" : "checkpoint_3"));
    if (restart == 0) CHECK(accel_test::bitwise_equal(*restarted.net, *uninterrupted.net));
  }
  std::vector<std::string> names;
  for (const auto& [number, path] : accel::detail::numbered_checkpoints(root))
    names.push_back(path.filename().string());
  CHECK(names == std::vector<std::string>{"checkpoint_0", "checkpoint_1", "checkpoint_2", "checkpoint_3",
                                          "checkpoint_4"});  // after steps 9 and 12: past checkpoint_2
  CHECK_FALSE(std::filesystem::exists(root / "checkpoint_2" / "accel_checksums.txt"));
  CHECK(accel_test::text_of(root / "checkpoint_2" / "random_states_0.bin") == left);
  accel::detail::remove_tree(dir);
}

// Issue 39, item 8: the loop of docs/distributed-nodes.md ended with `break` at its target, before its range moved
// on from the last batch (when a due checkpoint is written): 40 steps saved every 5 left step 35 as the newest
// checkpoint.
TEST_CASE("redteam 8: the loop of docs/distributed-nodes.md saves its final state, and says so",
          "[checkpoint][resume]") {
  const auto dir = scratch("documented-loop");
  const accel::options options{.cpu = true,
                               .project = {.project_dir = dir.string(), .automatic_checkpoint_naming = true}};
  training_run run(1, 32, options, {.every_steps = 5});
  run.train_until(40);   // the documented loop: `if (acc.completed_steps() == 40) break;`
  run.acc.save_state();  // its last line
  training_run loaded(99, 32,
                      {.cpu = true, .project = {.project_dir = dir.string(), .automatic_checkpoint_naming = true}});
  loaded.acc.load_state();
  CHECK(loaded.acc.completed_steps() == 40);
  CHECK(accel_test::bitwise_equal(*loaded.net, *run.net));
  const auto docs = std::filesystem::path(ACCEL_SOURCE_DIR) / "docs";
  CHECK_THAT(
      accel_test::text_of(docs / "distributed-nodes.md"),
      Catch::Contains("    if (acc.completed_steps() == 200) break;\n  }\nacc.save_state();  // the final state"));
  accel::detail::remove_tree(dir);
}

TEST_CASE("every_steps counts the training range's steps: an evaluation loop inside it neither counts nor saves",
          "[checkpoint][resume]") {
  const auto dir = scratch("auto-save-eval");
  accel::accelerator<> acc{
      {.cpu = true, .project = {.project_dir = dir.string(), .automatic_checkpoint_naming = true}}};
  accel::checkpoint_automatically(acc, {.every_steps = 2});
  torch::nn::Linear net(3, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt, train, evaluation] =
      acc.prepare(net, sgd, accel_test::regression_batches(6, 4, 3, 1), accel_test::regression_batches(3, 4, 3, 1, 9));
  for (auto&& [x, y] : train) {
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
    for (auto&& [ex, ey] : evaluation) (void)torch::mse_loss(model(ex), ey);
  }
  CHECK(acc.completed_steps() == 6);
  CHECK(accel::detail::numbered_checkpoints(dir / "checkpoints").size() == 3);  // after steps 2, 4 and 6
  accel::detail::remove_tree(dir);
}

TEST_CASE("checkpoint_automatically needs automatic checkpoint naming, a count of steps, and to come before the loop",
          "[checkpoint][resume]") {
  accel::accelerator<> unnamed{{.cpu = true}};
  CHECK_THROWS_WITH(accel::checkpoint_automatically(unnamed, {.every_steps = 5}),
                    Catch::Contains("every_steps works with the numbered checkpoints of "
                                    "options::project.automatic_checkpoint_naming; set it to true"));
  CHECK_THROWS_WITH(accel::checkpoint_automatically(unnamed, {.resume = accel::resume::latest}),
                    Catch::Contains("resume = resume::latest works with"));
  const auto dir = scratch("auto-resume-late");
  training_run run(1, 32, {.cpu = true, .project = {.project_dir = dir.string(), .automatic_checkpoint_naming = true}});
  CHECK_THROWS_WITH(accel::checkpoint_automatically(run.acc, {.every_steps = -1}),
                    Catch::Contains("must be 0 (no automatic saves) or a number of optimizer steps"));
  run.train(1);
  CHECK_THROWS_WITH(accel::checkpoint_automatically(run.acc, {.resume = accel::resume::latest}),
                    Catch::Contains("call it before the training loop"));
  accel::checkpoint_automatically(run.acc, {.every_steps = 1});  // saving may start at any step
  run.train(2);  // a save when the range moves on from the first step's batch; train() leaves the second's early
  CHECK(accel::detail::numbered_checkpoints(dir / "checkpoints").size() == 1);
  accel::detail::remove_tree(dir);
}

TEST_CASE("load_state takes a checkpoint saved by another number of processes, a damaged count is refused",
          "[checkpoint][resume]") {
  const auto dir = scratch("world");
  accel::accelerator<> acc{{.cpu = true}};
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  {
    torch::NoGradGuard no_grad;
    net->bias.fill_(3.0f);
  }
  acc.save_state(dir / "state");
  const auto forge = [&](std::int64_t processes) {  // as a job of that many processes writes it
    torch::serialize::OutputArchive forged;
    forged.write("processes", c10::IValue(processes));
    forged.write("models", c10::IValue(std::int64_t{1}));
    forged.write("optimizers", c10::IValue(std::int64_t{0}));
    forged.save_to((dir / "state" / "accel_state.bin").string());
    std::filesystem::remove(dir / "state" / "accel_checksums.txt");  // unverified, as accel 0.1 wrote checkpoints
  };
  forge(2);
  {
    torch::NoGradGuard no_grad;
    net->bias.fill_(0.0f);
  }
  // Process 0's state and generators (tests/distributed: 2 processes -> 1, 3, 4); forged, so without a manifest.
  acc.load_state(dir / "state", {.allow_unchecked = true});
  CHECK(net->bias.item<float>() == 3.0f);
  forge(0);
  CHECK_THROWS_WITH(acc.load_state(dir / "state", {.allow_unchecked = true}),
                    Catch::Contains("says 0 processes wrote the checkpoint"));
  accel::detail::remove_tree(dir);
}

TEST_CASE("registered objects and the accumulation count are checkpointed", "[checkpoint][resume]") {
  const auto dir = scratch("registered");
  using counter = accel_test::reference_counter;
  using accelerator = accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<4>>;
  counter saved_counter{.value = 17};
  {
    accelerator acc{{.cpu = true}};
    acc.register_for_checkpointing(saved_counter);
    for (int i = 0; i < 6; ++i) auto scope = acc.accumulate();  // mid-window: micro-step 6 of 8
    acc.save_state(dir / "state");
  }
  CHECK(std::filesystem::exists(dir / "state" / "custom_checkpoint.bin"));
  accelerator acc{{.cpu = true}};
  counter restored;
  acc.register_for_checkpointing(restored);
  acc.load_state(dir / "state");
  CHECK(restored.value == 17);
  CHECK(acc.step() == 6);
  {
    auto scope = acc.accumulate();
  }
  {
    auto scope = acc.accumulate();
  }
  CHECK(acc.sync_gradients());  // the window goes on where it stopped: micro-step 8 synchronises
  accel::detail::remove_tree(dir);
}

TEST_CASE(
    "I4 register_for_checkpointing refuses objects without a serialiser, listing each by index, and registers "
    "none of them",
    "[checkpoint]") {
  struct not_checkpointable {};
  using counter = accel_test::reference_counter;
  accel::accelerator<> acc{{.cpu = true}};
  not_checkpointable first, second;
  counter fine;
  const auto refused = [&] { acc.register_for_checkpointing(first, fine, second); };
  CHECK_THROWS_AS(refused(), std::invalid_argument);
  CHECK_THROWS_WITH(refused(), Catch::Contains("- item at index 0, `") && Catch::Contains("- item at index 2, `") &&
                                   Catch::Contains("not_checkpointable`") && !Catch::Contains("item at index 1"));
  const auto dir = scratch("registered_none");
  acc.save_state(dir / "state");  // none of the three was registered
  CHECK_FALSE(std::filesystem::exists(dir / "state" / "custom_checkpoint.bin"));
  counter other;
  acc.register_for_checkpointing(fine, other);  // several at once, numbered in order
  fine.value = 3;
  other.value = 4;
  acc.save_state(dir / "state");
  CHECK(std::filesystem::exists(dir / "state" / "custom_checkpoint.bin"));
  CHECK(std::filesystem::exists(dir / "state" / "custom_checkpoint_1.bin"));
  fine.value = other.value = 0;
  acc.load_state(dir / "state");
  CHECK(fine.value == 3);
  CHECK(other.value == 4);
  accel::detail::remove_tree(dir);
}

// Issue: one accelerator reused for several attempts (Accelerate's memory.py) kept every attempt's model, and
// save_state wrote all of them. free_memory() releases what prepare registered.
TEST_CASE("free_memory: one accelerator, two attempts, the first model is released, save_state writes the second's",
          "[checkpoint][resume]") {
  const auto dir = scratch("free-memory");
  accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<2>> acc{{.cpu = true}};
  std::weak_ptr<torch::nn::Module> first_model;
  {
    auto net = accel_test::mlp(3, 64, 1);
    first_model = net.ptr();
    torch::optim::SGD optimizer(net->parameters(), 0.1);
    auto [model, opt] = acc.prepare(net, optimizer);
    {
      auto scope = acc.accumulate(model);
      acc.backward(model(torch::randn({4, 3})).sum());
    }
    CHECK(acc.step() == 1);
    acc.free_memory();
  }
  CHECK(first_model.expired());  // the accelerator kept no reference
  CHECK(acc.step() == 0);        // a new attempt counts its micro-steps afresh, as Accelerate's step = 0

  torch::manual_seed(3);
  auto second = torch::nn::Linear(3, 2);
  torch::optim::AdamW optimizer(second->parameters(), 1e-2);
  auto [model, opt] = acc.prepare(second, optimizer);
  for (int i = 0; i < 4; ++i) {
    auto scope = acc.accumulate(model);
    acc.backward(model(torch::randn({4, 3})).sum());
    opt.step();
    opt.zero_grad();
  }
  acc.save_state(dir / "state");
  CHECK(std::filesystem::exists(dir / "state" / "model.safetensors"));
  CHECK_FALSE(std::filesystem::exists(dir / "state" / "model_1.safetensors"));
  CHECK(std::filesystem::exists(dir / "state" / "optimizer.bin"));
  CHECK_FALSE(std::filesystem::exists(dir / "state" / "optimizer_1.bin"));

  accel::accelerator<accel::fp32, accel::single_process, accel::accumulate<2>> fresh{{.cpu = true}};
  auto loaded = torch::nn::Linear(3, 2);
  torch::optim::AdamW loaded_optimizer(loaded->parameters(), 1e-2);
  auto prepared = fresh.prepare(loaded, loaded_optimizer);
  fresh.load_state(dir / "state");
  CHECK(accel_test::bitwise_equal(*loaded, *second));
  accel::detail::remove_tree(dir);
}

// Issue 22, item 8: "ckpt/" with a trailing slash, "." and "" failed and left litter; a regular file was replaced.
TEST_CASE(
    "save_state's directory: a trailing slash works, empty, the working directory or above, and a file are "
    "refused, leaving nothing behind",
    "[checkpoint]") {
  const auto dir = scratch("save-paths");
  accel::accelerator<> acc{{.cpu = true}};
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  for (int twice = 0; twice < 2; ++twice) {  // the second save replaces the first
    acc.save_state((dir / "ckpt").string() + "/");
    CHECK(std::filesystem::exists(dir / "ckpt" / "model.safetensors"));
  }
  acc.load_state((dir / "ckpt").string() + "/");
  std::ofstream(dir / "a_file") << "keep me";
  using Catch::Contains;
  CHECK_THROWS_WITH(acc.save_state(""), Contains("empty path"));
  CHECK_THROWS_WITH(acc.save_state("."), Contains("is the working directory or one above it"));
  CHECK_THROWS_WITH(acc.save_state(std::filesystem::current_path().parent_path()), Contains("one above it"));
  CHECK_THROWS_WITH(acc.save_state(dir / "a_file"), Contains("is a file, not a directory"));
  std::ifstream kept(dir / "a_file");
  CHECK(std::string(std::istreambuf_iterator<char>(kept), {}) == "keep me");
  std::set<std::string> left;
  for (const auto& entry : accel::detail::directory_entries(dir)) left.insert(entry.path().filename().string());
  CHECK(left == std::set<std::string>{"a_file", "ckpt"});
  CHECK_FALSE(std::filesystem::exists("..partial"));
  CHECK_FALSE(std::filesystem::exists(".partial"));
  accel::detail::remove_tree(dir);
}

// Issue 22, item 8: odd checkpoint_N names made save_state() throw "stol" or wrap to a negative number.
TEST_CASE("automatic naming: names that are not save_state()'s are left alone, the largest number is refused",
          "[checkpoint]") {
  const auto dir = scratch("odd-names");
  accel::accelerator<> acc{
      {.cpu = true, .project = {.project_dir = dir.string(), .automatic_checkpoint_naming = true}}};
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  for (const char* name : {"checkpoint_2", "checkpoint_10", "checkpoint_99999999999999999999", "checkpoint_x",
                           "checkpoint_-1", "checkpoint_+3", "checkpoint_"})
    std::filesystem::create_directories(dir / "checkpoints" / name);
  CHECK(acc.save_state() == dir / "checkpoints" / "checkpoint_11");
  std::filesystem::create_directories(dir / "checkpoints" / "checkpoint_9223372036854775807");
  CHECK_THROWS_WITH(acc.save_state(), Catch::Contains("checkpoint_9223372036854775807") &&
                                          Catch::Contains("the largest number a checkpoint can have"));
  accel::detail::remove_tree(dir);
}

// Issue 22, item 4: an SGD checkpoint loaded into Adam overwrote the weights, then failed inside LibTorch; a damaged
// generator state did the same. Everything that can fail is tried before the weights change, and undone on failure.
TEST_CASE("load_state refuses another optimizer's state or a damaged generator state, changing nothing",
          "[checkpoint][resume]") {
  const auto dir = scratch("wrong-optimizer");
  {
    torch::manual_seed(1);
    accel_test::mlp net(3, 8, 1);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    accel::accelerator<> acc{{.cpu = true}};
    auto [model, opt] = acc.prepare(net, sgd);
    for (int i = 0; i < 2; ++i) {  // momentum buffers: the SGD state is not empty
      acc.backward(model(torch::randn({4, 3})).pow(2).mean());
      opt.step();
      opt.zero_grad();
    }
    acc.save_state(dir / "sgd");
  }
  torch::manual_seed(2);
  accel_test::mlp net(3, 8, 1);
  torch::optim::Adam adam(net->parameters(), 0.01);
  accel::accelerator<> acc{{.cpu = true}};
  auto [model, opt] = acc.prepare(net, adam);
  acc.backward(model(torch::randn({4, 3})).pow(2).mean());
  opt.step();  // Adam's state: step, exp_avg, exp_avg_sq
  opt.zero_grad();
  std::vector<torch::Tensor> weights;
  for (const auto& p : net->parameters()) weights.push_back(p.clone());
  const auto& first_state = static_cast<torch::optim::AdamParamState&>(
      *adam.state().at(accel::detail::compat::optimizer_state_key(net->parameters()[0])));
  const auto exp_avg = first_state.exp_avg().clone();
  const auto step = first_state.step();
  const auto unchanged = [&] {
    for (std::size_t i = 0; i < weights.size(); ++i) CHECK(torch::equal(net->parameters()[i], weights[i]));
    const auto& state = static_cast<torch::optim::AdamParamState&>(
        *adam.state().at(accel::detail::compat::optimizer_state_key(net->parameters()[0])));
    CHECK(torch::equal(state.exp_avg(), exp_avg));
    CHECK(state.step() == step);
  };
  CHECK_THROWS_WITH(acc.load_state(dir / "sgd"),
                    Catch::Contains("optimizer.bin does not fit") && Catch::Contains("nothing was loaded"));
  unchanged();

  // The same checkpoint saved by Adam, with the CPU generator state cut short.
  acc.save_state(dir / "adam");
  {
    torch::serialize::OutputArchive damaged;
    damaged.write("cpu_rng", torch::zeros({7}, torch::kByte));
    damaged.save_to((dir / "adam" / "random_states_0.bin").string());
  }
  // Its checksum would refuse the file first; without the manifest (as accel 0.1 wrote checkpoints) the generator
  // state itself is checked.
  std::filesystem::remove(dir / "adam" / "accel_checksums.txt");
  torch::NoGradGuard no_grad;
  for (auto& p : net->parameters()) p.add_(1);
  weights.clear();
  for (const auto& p : net->parameters()) weights.push_back(p.clone());
  CHECK_THROWS_WITH(acc.load_state(dir / "adam", {.allow_unchecked = true}),
                    Catch::Contains("random_states_0.bin holds a damaged cpu generator state"));
  unchanged();
  accel::detail::remove_tree(dir);
}

// Issue 22, item 1: save_state exchanged its directory whole, deleting the user's files in it (the tracker's
// metrics.csv when saving into project_dir) and replacing a symbolic link with a directory.
TEST_CASE("save_state keeps what accel did not write: files, directories, links, an open log, a linked directory",
          "[checkpoint]") {
  const auto dir = scratch("keep-others");
  accel::accelerator<> acc{{.cpu = true}};
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  const auto ckpt = dir / "ckpt";
  std::filesystem::create_directories(ckpt / "logs");
  std::ofstream(ckpt / "notes.txt") << "mine";
  std::ofstream(ckpt / "logs" / "run.txt") << "log";
  std::ofstream(ckpt / "optimizer_3.bin") << "a name accel writes, but no manifest lists it: the user's";
  std::filesystem::create_symlink("notes.txt", ckpt / "link");
  std::ofstream metrics(ckpt / "metrics.csv");  // kept open across the saves, as a tracker keeps its file
  metrics << "step,loss\n" << std::flush;
  for (int step = 0; step < 3; ++step) {
    acc.save_state(ckpt);
    metrics << step << ",0.5\n" << std::flush;
  }
  const auto text = accel_test::text_of;
  CHECK(text(ckpt / "metrics.csv") == "step,loss\n0,0.5\n1,0.5\n2,0.5\n");
  CHECK(text(ckpt / "notes.txt") == "mine");
  CHECK(text(ckpt / "logs" / "run.txt") == "log");
  CHECK(std::filesystem::is_symlink(ckpt / "link"));
  CHECK(std::filesystem::read_symlink(ckpt / "link") == "notes.txt");
  CHECK(text(ckpt / "optimizer_3.bin") == "a name accel writes, but no manifest lists it: the user's");
  CHECK(std::filesystem::exists(ckpt / "model.safetensors"));
  std::set<std::string> beside;
  for (const auto& entry : accel::detail::directory_entries(dir)) beside.insert(entry.path().filename().string());
  CHECK(beside == std::set<std::string>{"ckpt"});  // no staging directory or old checkpoint left
  acc.load_state(ckpt);

  // A symbolic link to the checkpoint's directory stays a link; the checkpoint goes where it points.
  std::filesystem::create_directories(dir / "elsewhere");
  std::filesystem::create_directory_symlink(dir / "elsewhere", dir / "linked");
  for (int twice = 0; twice < 2; ++twice) acc.save_state(dir / "linked");
  CHECK(std::filesystem::is_symlink(dir / "linked"));
  CHECK(std::filesystem::exists(dir / "elsewhere" / "model.safetensors"));
  acc.load_state(dir / "linked");
  accel::detail::remove_tree(dir);
}

// Issue 39, item 3: a checkpoint without its manifest was loaded unchecked, and one flipped bit crashed LibTorch 1.13's
// reader (and `accel merge-weights`). Only a full checkpoint of accel 0.1 may load without one, by an explicit choice.
TEST_CASE("redteam 3: a checkpoint without its manifest is refused (a sharded one always), merge_weights too",
          "[checkpoint]") {
  const auto dir = scratch("no-manifest");
  {
    accel::accelerator<accel::fp32, accel::fully_sharded<accel::gloo>> acc(
        {.sharding = {.state_dict = accel::state_dict_type::sharded}});
    auto net = torch::nn::Linear(4, 2);
    auto model = acc.prepare(net);
    acc.save_state(dir / "sharded");
    std::filesystem::remove(dir / "sharded" / "accel_checksums.txt");
    for (const bool allowed : {false, true})
      CHECK_THROWS_WITH(acc.load_state(dir / "sharded", {.allow_unchecked = allowed}),
                        Catch::Contains("is a sharded checkpoint without its accel_checksums.txt"));
    CHECK_THROWS_WITH(
        accel::merge_weights(dir / "sharded", dir / "merged"),
        Catch::Contains("accel::merge_weights: " + (dir / "sharded").string() + " has no accel_checksums.txt"));
  }
  accel::accelerator<> acc{{.cpu = true}};
  auto net = torch::nn::Linear(4, 2);
  auto model = acc.prepare(net);
  acc.save_state(dir / "full");
  std::filesystem::remove(dir / "full" / "accel_checksums.txt");
  CHECK_THROWS_WITH(acc.load_state(dir / "full"),
                    Catch::Contains("has no accel_checksums.txt") && Catch::Contains("{.allow_unchecked = true}"));
  CHECK_THROWS_WITH(accel::merge_weights(dir / "full", dir / "merged"), Catch::Contains("has no accel_checksums.txt"));
  acc.load_state(dir / "full", {.allow_unchecked = true});  // trusted: loads, and a save gives it its manifest
  acc.save_state(dir / "full");
  acc.load_state(dir / "full");
  accel::detail::remove_tree(dir);
}

// Issue 39, item 9: save_state deleted the user's files that carried accel's names. Only what the previous
// checkpoint's manifest lists is accel's now; a file of the user's that a save would write over refuses the save.
TEST_CASE("redteam 9: save_state removes only the files the previous checkpoint's manifest lists", "[checkpoint]") {
  const auto dir = scratch("user-named-files");
  const auto ckpt = dir / "ckpt";
  const auto text = accel_test::text_of;
  accel::accelerator<> acc{{.cpu = true}};
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  acc.save_state(ckpt);
  acc.save(acc.get_state_dict(model), ckpt / "pytorch_model.bin");  // exported by the user, as Accelerate's name
  std::ofstream(ckpt / "scheduler.bin") << "the user's";
  for (int twice = 0; twice < 2; ++twice) acc.save_state(ckpt);
  CHECK(text(ckpt / "scheduler.bin") == "the user's");
  CHECK(std::filesystem::exists(ckpt / "pytorch_model.bin"));
  acc.load_state(ckpt);
  // Now a scheduler is prepared: this save would write scheduler.bin over the user's file, so it is refused, and
  // the checkpoint there stays as it was.
  torch::optim::SGD sgd(net->parameters(), 0.1);
  torch::optim::StepLR step_lr(sgd, 1);
  auto [opt, sched] = acc.prepare(sgd, step_lr);
  CHECK_THROWS_WITH(acc.save_state(ckpt),
                    Catch::Contains((ckpt / "scheduler.bin").string() + " is not a file of the checkpoint there") &&
                        Catch::Contains("move it away"));
  CHECK(text(ckpt / "scheduler.bin") == "the user's");
  CHECK_FALSE(std::filesystem::exists(ckpt.string() + ".partial"));
  std::filesystem::remove(ckpt / "scheduler.bin");
  acc.save_state(ckpt);  // moved away: saves
  acc.load_state(ckpt);
  accel::detail::remove_tree(dir);
}

// Issue 22, item 3: one flipped bit in a .bin file crashed load_state inside LibTorch's reader. Every file is now
// checked against the manifest's size and CRC-32C before it is parsed.
TEST_CASE("a flipped bit anywhere in a checkpoint is refused with checkpoint_error, and nothing changes",
          "[checkpoint]") {
  const auto dir = scratch("bit-flips");
  torch::manual_seed(3);
  auto net = torch::nn::Linear(2, 1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  accel::accelerator<> acc{{.cpu = true}};
  auto [model, opt] = acc.prepare(net, sgd);
  acc.backward(model(torch::ones({1, 2})).sum());
  opt.step();
  acc.save_state(dir / "ckpt");
  torch::NoGradGuard no_grad;
  net->weight.fill_(7);  // what a load would overwrite
  std::vector<std::string> silent, other_errors;
  std::size_t flips = 0;
  for (const auto& entry : accel::detail::directory_entries(dir / "ckpt")) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string original(std::istreambuf_iterator<char>(in), {});
    // Every bit of the manifest (it is parsed as text, so a case bit matters), one bit of each byte elsewhere (the
    // CRC-32C catches any single flipped bit, and each byte's bit varies with its offset).
    const bool every_bit = entry.path().filename() == "accel_checksums.txt";
    for (std::size_t byte = 0; byte < original.size(); ++byte) {
      const int first_bit = every_bit ? 0 : static_cast<int>(byte % 8);
      for (int bit = first_bit; bit < (every_bit ? 8 : first_bit + 1); ++bit, ++flips) {
        auto damaged = original;
        damaged[byte] = static_cast<char>(damaged[byte] ^ (1 << bit));
        std::ofstream(entry.path(), std::ios::binary | std::ios::trunc) << damaged;
        const auto where =
            entry.path().filename().string() + " byte " + std::to_string(byte) + " bit " + std::to_string(bit);
        try {
          acc.load_state(dir / "ckpt");
          silent.push_back(where);
        } catch (const accel::checkpoint_error&) {
        } catch (const std::exception& e) {
          other_errors.push_back(where + ": " + e.what());
        }
      }
    }
    std::ofstream(entry.path(), std::ios::binary | std::ios::trunc) << original;
  }
  INFO(flips << " flips; silent: " << (silent.empty() ? "none" : silent.front())
             << "; other: " << (other_errors.empty() ? "none" : other_errors.front()));
  CHECK(flips > 5000);  // every byte of five files, the generator state alone ~5 KB
  CHECK(silent.empty());
  CHECK(other_errors.empty());
  CHECK(torch::all(net->weight == 7).item<bool>());
  acc.load_state(dir / "ckpt");  // undamaged again: loads
  CHECK_FALSE(torch::all(net->weight == 7).item<bool>());
  accel::detail::remove_tree(dir);
}

// Issue 22, item 6: two processes saving into one directory produced a mixed checkpoint that loaded without error.
// The staging directory is locked while a save writes it; here the lock is held as another process would hold it
// (tests/scripts/concurrent_saves.cmake runs two real processes).
TEST_CASE("a save into a directory another save is writing is refused, and the checkpoint there stays whole",
          "[checkpoint]") {
  const auto dir = scratch("locked");
  accel::accelerator<> acc{{.cpu = true}};
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  acc.save_state(dir / "ckpt");
  std::filesystem::create_directories(dir / "ckpt.partial");
  {
    const int other_save = ::open((dir / "ckpt.partial").c_str(), O_RDONLY | O_DIRECTORY);
    REQUIRE(::flock(other_save, LOCK_EX) == 0);
    CHECK_THROWS_WITH(acc.save_state(dir / "ckpt"), Catch::Contains("another process is saving into") &&
                                                        Catch::Contains("two jobs must not save into one directory"));
    ::close(other_save);
  }
  acc.load_state(dir / "ckpt");
  acc.save_state(dir / "ckpt");  // the other save is over: a stale staging directory is no obstacle
  CHECK_FALSE(std::filesystem::exists(dir / "ckpt.partial"));
  accel::detail::remove_tree(dir);
}

// Issue 22, item 2: a full disk while LibTorch wrote an archive aborted the process, and with total_limit = 1 the
// previous checkpoint was already pruned. Run by tests/scripts/full_disk.sh in a small tmpfs ($ACCEL_FULL_DISK_DIR):
// the disk is filled to leave 0, 4, 8, ... KiB free, so that the save runs out of space in every file in turn.
TEST_CASE("a save on a full disk is a checkpoint_error and the previous checkpoint stays loadable", "[.full_disk]") {
  const char* where = std::getenv("ACCEL_FULL_DISK_DIR");
  REQUIRE(where != nullptr);
  const std::filesystem::path dir = where;
  accel::accelerator<> acc{
      {.cpu = true,
       .project = {.project_dir = (dir / "project").string(), .automatic_checkpoint_naming = true, .total_limit = 1}}};
  torch::nn::Linear net(64, 64);
  torch::optim::Adam adam(net->parameters());
  auto [model, opt] = acc.prepare(net, adam);
  acc.backward(model(torch::ones({1, 64})).sum());
  opt.step();  // Adam's state: the optimizer file is twice the model's
  const auto set_bias = [&](float value) {
    torch::NoGradGuard no_grad;
    net->bias.fill_(value);
  };
  set_bias(0);
  std::uintmax_t checkpoint_bytes = 0;
  for (const auto& entry : accel::detail::directory_entries(acc.save_state()))
    checkpoint_bytes += std::filesystem::file_size(entry.path());
  float saved = 0;
  int failed = 0, succeeded = 0;
  for (std::uintmax_t free_bytes = 0; free_bytes < checkpoint_bytes + 65536; free_bytes += 4096) {
    {
      std::ofstream filler(dir / "filler", std::ios::binary);
      const auto space = std::filesystem::space(dir).available;
      const std::string block(4096, 'x');
      for (std::uintmax_t written = 0; written + free_bytes < space && filler; written += block.size())
        filler.write(block.data(), static_cast<std::streamsize>(block.size()));
    }
    const float attempt = static_cast<float>(free_bytes / 4096 + 1);
    set_bias(attempt);
    try {
      acc.save_state();
      saved = attempt;
      ++succeeded;
    } catch (const accel::checkpoint_error& e) {
      UNSCOPED_INFO(free_bytes << " bytes free: " << e.what());
      ++failed;
    }
    std::filesystem::remove(dir / "filler");
    set_bias(-1);
    acc.load_state();  // the newest complete checkpoint
    CHECK(net->bias[0].item<float>() == saved);
    std::size_t checkpoints = 0;
    for (const auto& entry : accel::detail::directory_entries(dir / "project" / "checkpoints")) {
      INFO(entry.path());
      CHECK(entry.path().filename().string().find("partial") == std::string::npos);
      ++checkpoints;
    }
    CHECK(checkpoints == 1);  // total_limit
  }
  CHECK(failed > 3);
  CHECK(succeeded > 0);
}

TEST_CASE("the files of a sharded checkpoint are accel's own names, names like them are not", "[checkpoint]") {
  using accel::detail::is_checkpoint_file;
  for (const char* name :
       {"shard_layout.bin", "model_shard_0.safetensors", "model_1_shard_12.safetensors",
        "optimizer_shard_3.safetensors", "optimizer_2_shard_0.safetensors", "model_shard_0.safetensors.tmp4242"}) {
    INFO(name);
    CHECK(is_checkpoint_file(name));
  }
  for (const char* name : {"model_shard_.safetensors", "model_shard_x.safetensors", "notes_shard_0.safetensors",
                           "model_shard_0.bin", "my_model_shard_0.safetensors", "model_x_shard_0.safetensors"}) {
    INFO(name);
    CHECK_FALSE(is_checkpoint_file(name));
  }
}

// Issue 16: state_dict_type::sharded on one process (on several: tests/distributed/test_sharded.cpp).
TEST_CASE(
    "a sharded checkpoint on one process resumes bit for bit, under fully_sharded with a shard unit and under "
    "data_parallel, merge_weights writes the full weights of it and of a full checkpoint, a missing shard file is "
    "refused with nothing changed",
    "[checkpoint][resume]") {
  using sharded = accel::accelerator<accel::fp32, accel::fully_sharded<accel::gloo>>;
  using replicated = accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>>;
  const auto dir = scratch("sharded_format"), full_dir = scratch("full_format"), merged = scratch("merged");
  const accel::options sharded_files{.sharding = {.state_dict = accel::state_dict_type::sharded}};
  // Steps [first, last), loading `from` first and saving into `to` after, when given.
  const auto run = [&]<class Accelerator>(std::type_identity<Accelerator>, int first, int last,
                                          const std::filesystem::path& from, const std::filesystem::path& to,
                                          const accel::options& opts) {
    Accelerator acc(opts);
    torch::manual_seed(first == 0 ? 1 : 77);
    torch::nn::Sequential net(accel::shard_unit(torch::nn::Linear(5, 7)), torch::nn::Tanh(), torch::nn::Linear(7, 2));
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.05));
    auto [model, opt] = acc.prepare(net, adamw);
    if (!from.empty()) acc.load_state(from);
    for (int step = first; step < last; ++step) {
      torch::manual_seed(100 + step);
      acc.backward(model(torch::randn({3, 5})).pow(2).mean());
      opt.step();
      opt.zero_grad();
    }
    if (!to.empty()) acc.save_state(to);
    return acc.get_state_dict(model);
  };
  const auto uninterrupted = run(std::type_identity<sharded>{}, 0, 6, {}, {}, {});
  const auto saved = run(std::type_identity<sharded>{}, 0, 3, {}, dir, sharded_files);
  run(std::type_identity<sharded>{}, 0, 3, {}, full_dir, {});
  CHECK(std::filesystem::exists(dir / "model_shard_0.safetensors"));
  CHECK(std::filesystem::exists(dir / "optimizer_shard_0.safetensors"));
  CHECK(std::filesystem::exists(dir / "shard_layout.bin"));
  CHECK_FALSE(std::filesystem::exists(dir / "model.safetensors"));
  for (const auto& resumed : {run(std::type_identity<sharded>{}, 3, 6, dir, {}, sharded_files),
                              run(std::type_identity<replicated>{}, 3, 6, dir, {}, {})}) {
    REQUIRE(resumed.size() == uninterrupted.size());
    for (std::size_t i = 0; i < resumed.size(); ++i) CHECK(torch::equal(resumed[i].second, uninterrupted[i].second));
  }
  // The full weights: assembled from the shard files, or read from the full checkpoint, as saved.
  for (const auto& checkpoint : {dir, full_dir}) {
    const auto files = accel::merge_weights(checkpoint, merged / checkpoint.filename());
    REQUIRE(files.size() == 1);
    const auto weights = accel::safetensors::load(files.front());
    REQUIRE(weights.size() == saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i) {
      CHECK(weights[i].first == saved[i].first);
      CHECK(torch::equal(weights[i].second, saved[i].second));
    }
  }
  CHECK_THROWS_WITH(accel::merge_weights(dir / "nothing", merged / "x"), Catch::Contains("no checkpoint at"));
  // A shard file gone: refused before anything changes.
  std::filesystem::remove(dir / "optimizer_shard_0.safetensors");
  sharded acc;
  torch::manual_seed(77);
  torch::nn::Sequential net(accel::shard_unit(torch::nn::Linear(5, 7)), torch::nn::Tanh(), torch::nn::Linear(7, 2));
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.05));
  auto [model, opt] = acc.prepare(net, adamw);
  const auto before = acc.get_state_dict(model);
  CHECK_THROWS_WITH(acc.load_state(dir), Catch::Contains("optimizer_shard_0.safetensors"));
  const auto after = acc.get_state_dict(model);
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(torch::equal(after[i].second, before[i].second));
  accel::detail::remove_tree(dir);
  accel::detail::remove_tree(full_dir);
  accel::detail::remove_tree(merged);
}

TEST_CASE("directory_entries and remove_tree answer as std::filesystem does, without its directory iterators",
          "[checkpoint]") {
  namespace fs = std::filesystem;
  const auto dir = scratch("directory_entries");
  const auto outside = scratch("directory_entries_outside");
  std::ofstream(outside / "kept.txt") << "kept";
  fs::create_directories(dir / "sub" / "deeper");
  std::ofstream(dir / "file.txt") << "x";
  std::ofstream(dir / "sub" / "deeper" / "inner.txt") << "y";
  fs::create_directory_symlink(outside, dir / "link_to_outside");
  fs::create_symlink(dir / "nowhere", dir / "dangling");

  std::map<std::string, std::string> seen;  // name -> what it is
  for (const auto& entry : accel::detail::directory_entries(dir))
    seen[entry.path().filename().string()] =
        std::string(entry.is_symlink() ? "link to " : "") + (entry.is_regular_file() ? "file"
                                                             : entry.is_directory()  ? "directory"
                                                                                     : "nothing");
  CHECK(seen == std::map<std::string, std::string>{{"file.txt", "file"},
                                                   {"sub", "directory"},
                                                   {"link_to_outside", "link to directory"},
                                                   {"dangling", "link to nothing"}});
  CHECK_THROWS_AS(accel::detail::directory_entries(dir / "missing"), fs::filesystem_error);

  accel::detail::remove_tree(dir);  // a link to a directory is removed, not followed
  CHECK_FALSE(fs::exists(fs::symlink_status(dir)));
  CHECK(fs::exists(outside / "kept.txt"));
  CHECK_NOTHROW(accel::detail::remove_tree(dir));    // nothing there is no error
  accel::detail::remove_tree(outside / "kept.txt");  // a file alone
  CHECK(accel::detail::directory_entries(outside).empty());
  accel::detail::remove_tree(outside);
}

// Issue 37: Accelerate's file set (file_set::accelerate; docs/python.md). What Python reads and writes is
// checked by interop.checkpoint.*; here, that accel reads back what it writes in that layout (through its own pickle
// reader), and that a checkpoint that does not fit the program names the first difference.
namespace {
struct accelerate_layout_run {
  accel::accelerator<> acc{{.cpu = true}};
  torch::nn::Sequential net;
  torch::optim::AdamW adamw;
  torch::optim::StepLR step_lr;
  // Kept: a prepared object's registration for checkpointing lasts as long as it does.
  decltype(std::declval<accel::accelerator<>&>().prepare(net, adamw, step_lr)) prepared;
  explicit accelerate_layout_run(torch::nn::Sequential model)
      : net(std::move(model)),
        adamw(net->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.1)),
        step_lr(adamw, 2, 0.5),
        prepared(acc.prepare(net, adamw, step_lr)) {}
  void train(int steps) {
    auto& [model, opt, sched] = prepared;
    for (int i = 0; i < steps; ++i) {
      acc.backward(model(torch::randn({3, 2})).pow(2).mean());
      opt.step();
      sched.step();
      opt.zero_grad();
    }
  }
};
torch::nn::Sequential two_layers(int hidden) {
  return torch::nn::Sequential(torch::nn::Linear(2, hidden), torch::nn::Tanh(), torch::nn::Linear(hidden, 1));
}
}  // namespace

TEST_CASE("a checkpoint in Accelerate's layout loads back: weights, AdamW state, learning rate, StepLR, generator",
          "[checkpoint][interop]") {
  const auto dir = scratch("accelerate-layout");
  torch::manual_seed(2);
  accelerate_layout_run saved(two_layers(3));
  saved.train(5);
  saved.acc.save_state(dir / "ckpt", {.files = accel::file_set::accelerate});
  for (const char* file : {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"})
    CHECK(std::filesystem::exists(dir / "ckpt" / file));
  CHECK_FALSE(std::filesystem::exists(dir / "ckpt" / "accel_state.bin"));
  const auto draw = torch::randn({4});  // what the generator gives after the save

  accelerate_layout_run loaded(two_layers(3));
  loaded.acc.load_state(dir / "ckpt");
  CHECK(accel_test::bitwise_equal(*saved.net, *loaded.net));
  CHECK(accel_test::all_equal(accel_test::adamw_state(saved.adamw), accel_test::adamw_state(loaded.adamw)));
  CHECK(loaded.adamw.param_groups()[0].options().get_lr() == saved.adamw.param_groups()[0].options().get_lr());
  CHECK(accel::detail::lr_scheduler_access::step_count(loaded.step_lr) == 5u);
  CHECK(torch::equal(torch::randn({4}), draw));
  accel::detail::remove_tree(dir);
}

TEST_CASE("an Accelerate checkpoint that does not fit the program names the first difference, and nothing changes",
          "[checkpoint][interop]") {
  const auto dir = scratch("accelerate-mismatch");
  torch::manual_seed(4);
  accelerate_layout_run saved(two_layers(3));
  saved.train(2);
  saved.acc.save_state(dir / "ckpt", {.files = accel::file_set::accelerate});

  accelerate_layout_run wider(two_layers(4));  // every weight of another shape
  const auto before = wider.net->parameters()[0].clone();
  CHECK_THROWS_WITH(wider.acc.load_state(dir / "ckpt"),
                    Catch::Contains("model.safetensors do not fit the prepared model") &&
                        Catch::Contains("0.weight: the file has Float[3, 2], the model Float[4, 2]"));
  CHECK(torch::equal(wider.net->parameters()[0], before));

  // An extra layer: its keys are missing from the checkpoint, named.
  accelerate_layout_run deeper(torch::nn::Sequential(torch::nn::Linear(2, 3), torch::nn::Tanh(),
                                                     torch::nn::Linear(3, 1), torch::nn::Linear(1, 1)));
  CHECK_THROWS_WITH(deeper.acc.load_state(dir / "ckpt"), Catch::Contains("missing: 3.weight"));

  // The same shapes, but an optimizer state whose tensor does not fit its parameter (a damaged or foreign file).
  auto state = accel::detail::python_optimizer_state(saved.adamw, "test");
  auto states = accel::detail::python_item(state, "state", "test").toGenericDict();
  auto first = states.at(std::int64_t{0}).toGenericDict();
  first.insert_or_assign("exp_avg", torch::zeros({7}));
  accel::detail::write_torch_save(state, dir / "ckpt", "optimizer.bin");
  accelerate_layout_run same(two_layers(3));
  CHECK_THROWS_WITH(
      same.acc.load_state(dir / "ckpt"),
      Catch::Contains("in the Accelerate checkpoint, " + (dir / "ckpt" / "optimizer.bin").string() +
                      "'s state of parameter 0 (0.weight)'s exp_avg has shape [7], its parameter [3, 2]"));
  CHECK(same.adamw.state().empty());
  accel::detail::remove_tree(dir);
}
