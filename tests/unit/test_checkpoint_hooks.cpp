// Issue 18's checkpoint items on one process: save_state / load_state pre-hooks (arguments, order, removal, weights
// a hook removes, a hook that throws), load_state's map_location (reference I5), the automatic numbering of
// project.iteration and save_iteration(), and save_on_each_node's refusal of the sharded format. On 2 processes:
// tests/distributed/test_checkpoint_hooks.cpp; on two nodes: tests/scripts/save_on_each_node.py.
#include <catch2/catch.hpp>

#include <filesystem>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

using training_run = accel_test::resumable_run<accel::accelerator<>>;
using module_list = std::vector<std::shared_ptr<torch::nn::Module>>;
using weight_list = std::vector<accel::safetensors::tensor_list>;

std::filesystem::path hooks_scratch(const std::string& name) {
  return accel_test::scratch_directory("checkpoint_" + name);
}

/// The names `save_state` wrote into `directory`: its regular files.
std::set<std::string> files_in(const std::filesystem::path& directory) {
  std::set<std::string> names;
  for (const auto& entry : accel::detail::directory_entries(directory))
    if (entry.is_regular_file()) names.insert(entry.path().filename().string());
  return names;
}

/// The `checkpoint_{i}` directories under `root`, by name.
std::set<std::string> checkpoints_in(const std::filesystem::path& root) {
  std::set<std::string> names;
  for (const auto& [number, path] : accel::detail::numbered_checkpoints(root)) names.insert(path.filename().string());
  return names;
}

at::Tensor momentum_of(torch::optim::SGD& sgd, const at::Tensor& parameter) {
  return static_cast<torch::optim::SGDParamState&>(
             *sgd.state().at(accel::detail::compat::optimizer_state_key(parameter)))
      .momentum_buffer();
}

torch::optim::AdamWParamState& adamw_state(torch::optim::AdamW& adamw, const at::Tensor& parameter) {
  return static_cast<torch::optim::AdamWParamState&>(
      *adamw.state().at(accel::detail::compat::optimizer_state_key(parameter)));
}

/// Two models and an SGD optimizer with momentum over both, one step taken: state in every file kind.
struct two_models {
  explicit two_models(std::uint64_t seed)
      : first((torch::manual_seed(seed), torch::nn::Linear(2, 3))),
        second(torch::nn::Linear(3, 1)),
        sgd(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)),
        prepared(acc.prepare(first, second, sgd)) {
    auto& [a, b, opt] = prepared;
    acc.backward(b(a(torch::ones({4, 2}))).pow(2).sum());
    opt.step();
    opt.zero_grad();
  }
  std::vector<at::Tensor> parameters() const {
    auto all = first->parameters();
    for (const auto& p : second->parameters()) all.push_back(p);
    return all;
  }
  /// Every parameter and momentum buffer, copied.
  std::vector<at::Tensor> snapshot() {
    std::vector<at::Tensor> all;
    for (const auto& p : parameters()) {
      all.push_back(p.detach().clone());
      all.push_back(momentum_of(sgd, p).clone());
    }
    return all;
  }

  accel::accelerator<> acc{{.cpu = true}};
  torch::nn::Linear first, second;
  torch::optim::SGD sgd;
  decltype(std::declval<accel::accelerator<>&>().prepare(std::declval<torch::nn::Linear&>(),
                                                         std::declval<torch::nn::Linear&>(),
                                                         std::declval<torch::optim::SGD&>())) prepared;
};

}  // namespace

TEST_CASE(
    "save and load pre-hooks get the models, their weights and the directory, in registration order, at every save "
    "and load, a handle removes its hook, destroying it does not",
    "[checkpoint]") {
  const auto dir = hooks_scratch("hook-arguments");
  two_models run(1);
  std::vector<std::string> calls;
  const auto save_hook = [&](const char* name) {
    return [&, name](const module_list& models, weight_list& weights, const std::filesystem::path& directory) {
      calls.push_back(std::string("save ") + name);
      REQUIRE(models.size() == 2);
      CHECK(models[0].get() == run.first.ptr().get());
      CHECK(models[1].get() == run.second.ptr().get());
      REQUIRE(weights.size() == 2);
      CHECK(weights[0].size() == 2);
      CHECK(weights[0][0].first == "weight");
      CHECK(weights[0][1].first == "bias");
      CHECK(torch::equal(weights[0][0].second, run.first->weight));
      CHECK(torch::equal(weights[1][1].second, run.second->bias));
      CHECK(directory == dir / "ckpt");
    };
  };
  const auto load_hook = [&](const char* name) {
    return [&, name](module_list& models, const std::filesystem::path& directory) {
      calls.push_back(std::string("load ") + name);
      REQUIRE(models.size() == 2);
      CHECK(models[1].get() == run.second.ptr().get());
      CHECK(directory == dir / "ckpt");
    };
  };
  auto save_a = run.acc.register_save_state_pre_hook(save_hook("a"));
  auto save_b = run.acc.register_save_state_pre_hook(save_hook("b"));
  auto load_a = run.acc.register_load_state_pre_hook(load_hook("a"));
  {
    auto load_b = run.acc.register_load_state_pre_hook(load_hook("b"));
  }  // the handle goes, the hook stays
  run.acc.save_state(dir / "ckpt");
  run.acc.load_state(dir / "ckpt");
  CHECK(calls == std::vector<std::string>{"save a", "save b", "load a", "load b"});

  calls.clear();
  save_a.remove();
  load_a.remove();
  load_a.remove();  // again: nothing
  run.acc.save_state(dir / "ckpt");
  run.acc.load_state(dir / "ckpt");
  CHECK(calls == std::vector<std::string>{"save b", "load b"});

  calls.clear();
  auto copy = save_b;  // a copy removes the same hook
  copy.remove();
  save_b.remove();
  run.acc.save_state(dir / "ckpt");
  CHECK(calls.empty());

  CHECK_THROWS_WITH(run.acc.register_save_state_pre_hook({}),
                    Catch::Contains("accel::register_save_state_pre_hook: the hook is an empty function"));
  accel::removable_handle outlived;
  {
    accel::accelerator<> gone{{.cpu = true}};
    outlived = gone.register_load_state_pre_hook([](module_list&, const std::filesystem::path&) {});
  }
  outlived.remove();  // its accelerator is gone: nothing to do
  accel::detail::remove_tree(dir);
}

TEST_CASE(
    "a save hook that saves a model itself and removes its weights: the rest is numbered from model.safetensors, the "
    "manifest lists exactly the files written, and a load hook that removes the same model loads the rest",
    "[checkpoint][resume]") {
  const auto dir = hooks_scratch("hook-weights");
  const auto ckpt = dir / "ckpt";
  std::vector<at::Tensor> saved;
  {
    two_models run(1);
    run.acc.register_save_state_pre_hook(
        [](const module_list& models, weight_list& weights, const std::filesystem::path& directory) {
          accel::save_model(*models[0], directory / "first");  // the model the hook saves its own way
          weights.erase(weights.begin());
        });
    run.acc.save_state(ckpt);
    saved = run.snapshot();
    // model.safetensors holds the second model, the one left.
    const auto model_file = accel::safetensors::load(ckpt / "model.safetensors");
    REQUIRE(model_file.size() == 2);
    CHECK(torch::equal(model_file[0].second, run.second->weight));
  }
  CHECK(files_in(ckpt) == std::set<std::string>{"accel_checksums.txt", "accel_state.bin", "model.safetensors",
                                                "optimizer.bin", "random_states_0.bin"});
  CHECK(std::filesystem::exists(ckpt / "first" / "model.safetensors"));  // the hook's directory, kept by the save
  const auto manifest = accel::detail::read_manifest(ckpt);
  REQUIRE(manifest.has_value());
  std::set<std::string> listed;
  for (const auto& [name, file] : manifest->files()) listed.insert(name);
  auto written = files_in(ckpt);
  written.erase("accel_checksums.txt");
  CHECK(listed == written);
  torch::serialize::InputArchive counts;
  counts.load_from((ckpt / "accel_state.bin").string());
  c10::IValue model_count;
  counts.read("models", model_count);
  CHECK(model_count.toInt() == 1);

  two_models resumed(2);
  const auto before = resumed.snapshot();
  using Catch::Contains;
  // Without the matching load hook, the counts differ: refused, nothing loaded.
  CHECK_THROWS_WITH(resumed.acc.load_state(ckpt), Contains("has 1 models, this program 2; prepare the same objects"));
  auto keeps_all = resumed.acc.register_load_state_pre_hook([](module_list&, const std::filesystem::path&) {});
  CHECK_THROWS_WITH(resumed.acc.load_state(ckpt),
                    Contains("this program 2 after its load_state pre-hooks (which must remove the models whose "
                             "weights its save_state pre-hooks removed)"));
  keeps_all.remove();
  CHECK(accel_test::all_equal(resumed.snapshot(), before));
  resumed.acc.register_load_state_pre_hook([](module_list& models, const std::filesystem::path& directory) {
    accel::load_model(*models[0], directory / "first");
    models.erase(models.begin());
  });
  resumed.acc.load_state(ckpt);
  CHECK(accel_test::all_equal(resumed.snapshot(), saved));
  accel::detail::remove_tree(dir);
}

TEST_CASE(
    "a save hook that throws fails the save before anything is written, the previous checkpoint kept, a load hook "
    "that throws loads nothing",
    "[checkpoint]") {
  const auto dir = hooks_scratch("hook-throws");
  const auto ckpt = dir / "ckpt";
  two_models run(1);
  run.acc.save_state(ckpt);
  const auto manifest = accel_test::text_of(ckpt / "accel_checksums.txt");
  const auto saved = run.snapshot();
  {
    torch::NoGradGuard no_grad;
    run.second->bias.fill_(5);
  }
  auto failing_save = run.acc.register_save_state_pre_hook(
      [](const module_list&, weight_list&, const std::filesystem::path&) { throw std::runtime_error("disk quota"); });
  CHECK_THROWS_WITH(run.acc.save_state(ckpt), "disk quota");
  CHECK(accel_test::text_of(ckpt / "accel_checksums.txt") == manifest);
  CHECK_FALSE(std::filesystem::exists(dir / "ckpt.partial"));
  const auto changed = run.snapshot();
  auto failing_load = run.acc.register_load_state_pre_hook(
      [](module_list&, const std::filesystem::path&) { throw std::runtime_error("no such subfolder"); });
  CHECK_THROWS_WITH(run.acc.load_state(ckpt), "no such subfolder");
  CHECK(accel_test::all_equal(run.snapshot(), changed));
  CHECK_FALSE(run.acc.resumed_from().has_value());
  failing_load.remove();
  run.acc.load_state(ckpt);  // the checkpoint saved before the failure
  CHECK(accel_test::all_equal(run.snapshot(), saved));
  failing_save.remove();
  run.acc.save_state(ckpt);
  CHECK(accel_test::text_of(ckpt / "accel_checksums.txt") == manifest);  // the same state, the same files
  accel::detail::remove_tree(dir);
}

TEST_CASE(
    "I5 load_state with map_location::cpu and map_location::on_device loads the same optimizer state bit for bit, "
    "on its parameters' device, and both resume as the uninterrupted run",
    "[checkpoint][resume]") {
  const auto dir = hooks_scratch("map-location");
  training_run uninterrupted(1, 32);
  uninterrupted.train(8);
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_moments;
  {
    training_run first_part(1, 32);
    first_part.train(5);
    first_part.acc.save_state(dir / "state");
    for (const auto& p : first_part.net->parameters()) {
      const auto& state = adamw_state(first_part.optimizer, p);
      saved_moments.emplace_back(state.exp_avg().clone(), state.exp_avg_sq().clone());
    }
  }
  for (const auto where : {accel::map_location::cpu, accel::map_location::on_device}) {
    INFO((where == accel::map_location::cpu ? "cpu" : "on_device"));
    training_run resumed(99, 32);
    resumed.acc.load_state(dir / "state", where);
    const auto parameters = resumed.net->parameters();
    REQUIRE(parameters.size() == saved_moments.size());
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      const auto& state = adamw_state(resumed.optimizer, parameters[i]);
      CHECK(torch::equal(state.exp_avg(), saved_moments[i].first));
      CHECK(torch::equal(state.exp_avg_sq(), saved_moments[i].second));
      CHECK(state.exp_avg().device() == parameters[i].device());
      CHECK(state.exp_avg_sq().device() == parameters[i].device());
    }
    resumed.train(3);
    CHECK(accel_test::bitwise_equal(*resumed.net, *uninterrupted.net));
  }
  accel::detail::remove_tree(dir);
}

TEST_CASE("map_location's default is Accelerate's: on_device with several processes on devices of their own, else cpu",
          "[checkpoint]") {
  using accel::detail::read_device;
  const c10::Device cpu(c10::kCPU), cuda1("cuda:1");
  CHECK(read_device(std::nullopt, 1, cpu) == cpu);
  CHECK(read_device(std::nullopt, 2, cpu) == cpu);  // Gloo on the CPU: several processes, no device of their own
  CHECK(read_device(std::nullopt, 1, c10::Device("cuda:0")) == cpu);
  CHECK(read_device(std::nullopt, 2, cuda1) == cuda1);
  CHECK(read_device(accel::map_location::cpu, 2, cuda1) == cpu);
  CHECK(read_device(accel::map_location::on_device, 1, cuda1) == cuda1);
}

// LibTorch's Optimizer::load leaves the state where the archive was read to; PyTorch's load_state_dict moves it to
// the parameters. Without a GPU, the meta device stands for another device than the one read to.
TEST_CASE(
    "the optimizer state read to one device is placed on its parameters' device: field by field for Adam and SGD, "
    "through its archive for LBFGS",
    "[checkpoint]") {
  using accel::detail::place_state_on_parameters;
  using accel::detail::compat::optimizer_state_key;
  const auto meta = torch::TensorOptions().device(torch::kMeta).requires_grad(true);
  auto on_meta = torch::zeros({3}, meta);
  torch::optim::Adam adam(std::vector<at::Tensor>{on_meta});
  auto read_state = std::make_unique<torch::optim::AdamParamState>();
  read_state->step(4);
  read_state->exp_avg(torch::ones({3}));
  read_state->exp_avg_sq(torch::full({3}, 2.0));
  adam.state()[optimizer_state_key(on_meta)] = std::move(read_state);
  place_state_on_parameters(adam, c10::Device(c10::kCPU));
  const auto& placed = static_cast<torch::optim::AdamParamState&>(*adam.state().at(optimizer_state_key(on_meta)));
  CHECK(placed.exp_avg().device().is_meta());
  CHECK(placed.exp_avg_sq().device().is_meta());
  CHECK(placed.step() == 4);
  CHECK_FALSE(placed.max_exp_avg_sq().defined());  // an undefined field stays undefined

  // LBFGS's state has no fields accel knows: it is read again from its archive onto the parameter's device. Here the
  // parameter is on the CPU and the state "was read to" the meta device, so the state goes through its archive.
  torch::manual_seed(5);
  auto x = torch::randn({4}, torch::requires_grad());
  torch::optim::LBFGS lbfgs(std::vector<at::Tensor>{x}, torch::optim::LBFGSOptions(0.5).history_size(3));
  for (int i = 0; i < 2; ++i)
    lbfgs.step([&] {
      lbfgs.zero_grad();
      auto loss = (x - 1).pow(2).sum();
      loss.backward();
      return loss;
    });
  const auto state_bytes = [&] {
    torch::serialize::OutputArchive out;
    lbfgs.state().at(optimizer_state_key(x))->serialize(out);
    return accel::detail::serialised(out);
  };
  const auto before = state_bytes();
  const auto* const state_before = lbfgs.state().at(optimizer_state_key(x)).get();
  const auto d_before = static_cast<torch::optim::LBFGSParamState&>(*lbfgs.state().at(optimizer_state_key(x))).d();
  place_state_on_parameters(lbfgs, c10::Device(c10::kMeta));
  const auto& lbfgs_state = static_cast<torch::optim::LBFGSParamState&>(*lbfgs.state().at(optimizer_state_key(x)));
  CHECK(lbfgs.state().at(optimizer_state_key(x)).get() == state_before);
  CHECK_FALSE(lbfgs_state.d().is_same(d_before));  // read again: new tensors
  CHECK(torch::equal(lbfgs_state.d(), d_before));
  CHECK(lbfgs_state.d().device().is_cpu());
  CHECK(state_bytes() == before);  // the same state
}

TEST_CASE(
    "project.iteration: automatic saves write checkpoint_{iteration} and count up, total_limit removes the smallest "
    "numbers, a directory that exists is refused naming it and the fix, save_iteration() is the next number",
    "[checkpoint]") {
  const auto dir = hooks_scratch("iteration");
  const auto root = dir / "checkpoints";
  accel::accelerator<> acc{
      {.cpu = true,
       .project = {
           .project_dir = dir.string(), .automatic_checkpoint_naming = true, .total_limit = 2, .iteration = 5}}};
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  const auto set_bias = [&](float value) {
    torch::NoGradGuard no_grad;
    net->bias.fill_(value);
  };
  CHECK(acc.save_iteration() == 5);
  for (int i = 5; i < 8; ++i) {
    set_bias(static_cast<float>(i));
    CHECK(acc.save_state() == root / ("checkpoint_" + std::to_string(i)));
  }
  CHECK(acc.save_iteration() == 8);
  CHECK(checkpoints_in(root) == std::set<std::string>{"checkpoint_6", "checkpoint_7"});
  std::filesystem::create_directories(root / "checkpoint_8" / "notes");  // not ours: an automatic save stops
  using Catch::Contains;
  CHECK_THROWS_WITH(acc.save_state(), Contains((root / "checkpoint_8").string() +
                                               " already exists (save_iteration() is 8): an automatic save never "
                                               "replaces a checkpoint") &&
                                          Contains("acc.set_save_iteration(n)"));
  CHECK(acc.save_iteration() == 8);
  CHECK(checkpoints_in(root) == std::set<std::string>{"checkpoint_6", "checkpoint_7", "checkpoint_8"});
  acc.set_save_iteration(20);
  set_bias(20);
  CHECK(acc.save_state() == root / "checkpoint_20");
  // The two smallest go (total_limit 2, the new one included); checkpoint_8 holds nothing of accel's and stays whole.
  CHECK(checkpoints_in(root) == std::set<std::string>{"checkpoint_20", "checkpoint_8"});
  CHECK(std::filesystem::is_directory(root / "checkpoint_8" / "notes"));
  CHECK(acc.save_iteration() == 21);
  set_bias(0);
  acc.load_state();
  CHECK(net->bias.item<float>() == 20.0f);
  CHECK_THROWS_WITH(acc.set_save_iteration(-1),
                    "accel::set_save_iteration = -1 is not a checkpoint number: give 0 or "
                    "more (below the largest int64)");
  CHECK_THROWS_WITH(accel::accelerator<>({.cpu = true, .project = {.iteration = -3}}),
                    Contains("accel::options: project.iteration = -3 is not a checkpoint number"));
  accel::detail::remove_tree(dir);
}

TEST_CASE(
    "after load_state of checkpoint_k the next automatic save is k + 1, without project.iteration the numbering goes "
    "on after the highest checkpoint",
    "[checkpoint][resume]") {
  const auto dir = hooks_scratch("iteration-after-load");
  const auto root = dir / "checkpoints";
  const accel::options options{.cpu = true,
                               .project = {.project_dir = dir.string(), .automatic_checkpoint_naming = true}};
  {
    accel::accelerator<> first_run{options};
    auto net = torch::nn::Linear(2, 1);
    auto model = first_run.prepare(net);
    for (int i = 0; i < 4; ++i) CHECK(first_run.save_state() == root / ("checkpoint_" + std::to_string(i)));
  }
  accel::accelerator<> acc{options};  // a restarted program
  auto net = torch::nn::Linear(2, 1);
  auto model = acc.prepare(net);
  CHECK(acc.save_iteration() == 4);  // after the highest
  acc.load_state(root / "checkpoint_1");
  CHECK(acc.save_iteration() == 2);
  CHECK_THROWS_WITH(acc.save_state(), Catch::Contains("checkpoint_2 already exists (save_iteration() is 2)"));
  acc.load_state();  // the newest, checkpoint_3
  CHECK(acc.save_iteration() == 4);
  CHECK(acc.save_state() == root / "checkpoint_4");
  std::filesystem::create_directories(dir / "elsewhere");
  accel_test::copy_tree(root / "checkpoint_4", dir / "elsewhere" / "checkpoint_9");
  acc.load_state(dir / "elsewhere" / "checkpoint_9");  // not the project's: the numbering stays
  CHECK(acc.save_iteration() == 5);
  acc.load_state((root / "checkpoint_4").string() + "/");
  CHECK(acc.save_iteration() == 5);
  accel::detail::remove_tree(dir);
}

TEST_CASE(
    "under the sharded format the save hooks get no weights and the load hooks no models, save_on_each_node is "
    "refused there before anything is written",
    "[checkpoint]") {
  using sharded = accel::accelerator<accel::fp32, accel::fully_sharded<accel::gloo>>;
  const auto dir = hooks_scratch("hooks-sharded");
  {
    sharded acc({.sharding = {.state_dict = accel::state_dict_type::sharded}});
    torch::manual_seed(1);
    auto net = torch::nn::Linear(4, 2);
    torch::optim::Adam adam(net->parameters());
    auto [model, opt] = acc.prepare(net, adam);
    acc.backward(model(torch::ones({2, 4})).sum());
    opt.step();
    std::size_t weights_seen = 99, models_seen = 99;
    auto save_hook = acc.register_save_state_pre_hook(
        [&](const module_list& models, weight_list& weights, const std::filesystem::path&) {
          CHECK(models.size() == 1);
          weights_seen = weights.size();
        });
    acc.register_load_state_pre_hook(
        [&](module_list& models, const std::filesystem::path&) { models_seen = models.size(); });
    acc.save_state(dir / "ckpt");
    acc.load_state(dir / "ckpt");
    CHECK(std::filesystem::exists(dir / "ckpt" / "model_shard_0.safetensors"));
    CHECK(weights_seen == 0);
    CHECK(models_seen == 0);
    save_hook.remove();
    acc.register_save_state_pre_hook(
        [](const module_list&, weight_list& weights, const std::filesystem::path&) { weights.emplace_back(); });
    CHECK_THROWS_WITH(acc.save_state(dir / "other"), Catch::Contains("a save_state pre-hook added weights"));
    CHECK_FALSE(std::filesystem::exists(dir / "other"));
    acc.register_load_state_pre_hook(
        [&net](module_list& models, const std::filesystem::path&) { models.push_back(net.ptr()); });
    CHECK_THROWS_WITH(acc.load_state(dir / "ckpt"), Catch::Contains("a load_state pre-hook added models"));
  }
  sharded acc({.sharding = {.state_dict = accel::state_dict_type::sharded}, .project = {.save_on_each_node = true}});
  auto net = torch::nn::Linear(4, 2);
  auto model = acc.prepare(net);
  CHECK_THROWS_WITH(acc.save_state(dir / "each_node"),
                    Catch::Contains("options::project.save_on_each_node writes a whole checkpoint on each machine, "
                                    "which the sharded format") &&
                        Catch::Contains("use state_dict_type::full with save_on_each_node"));
  CHECK_FALSE(std::filesystem::exists(dir / "each_node"));
  CHECK_FALSE(std::filesystem::exists(dir / "each_node.partial"));
  accel::detail::remove_tree(dir);
}
