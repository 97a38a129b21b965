// find_executable_batch_size (case J3 of ../shared/reference/accelerate-semantics.md), should_reduce_batch_size, and
// the process-aware logger, on one process (the launcher's variables set by hand where a test plays another process).
#include <accel/module_tree.hpp>
#include <catch2/catch.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

using accel_test::j3_sizes;

volatile void* escaped = nullptr;  // where an allocation's address goes, so that it cannot be optimised away

/// Each way of running out of memory that find_executable_batch_size must recognise; real ones where this machine can
/// produce them.
enum class out_of_memory_kind { libtorch_cpu, bad_alloc, c10_out_of_memory, cuda_error_message, cudnn_not_supported };

[[noreturn]] void run_out_of_memory(out_of_memory_kind kind) {
  switch (kind) {
    case out_of_memory_kind::libtorch_cpu:
      accel_test::allocate_too_much();
      break;
    case out_of_memory_kind::bad_alloc: {  // 1 EiB through operator new
      std::vector<char> buffer(std::size_t{1} << 60);
      escaped = buffer.data();
      break;
    }
    case out_of_memory_kind::c10_out_of_memory:  // what CUDA's caching allocator throws
      C10_THROW_ERROR(OutOfMemoryError, "CUDA out of memory. Tried to allocate 2.00 GiB");
    case out_of_memory_kind::cuda_error_message:  // a CUDA call that ran out: a plain c10::Error
      C10_THROW_ERROR(Error, "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported");
    case out_of_memory_kind::cudnn_not_supported:
      C10_THROW_ERROR(Error,
                      "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
                      "non-contiguous input.");
  }
  FAIL("the allocation succeeded");
  throw std::logic_error("unreachable");
}

/// Sets the launcher's variables of process `rank` of `world` on one machine, for the scope.
struct as_process {
  as_process(int rank, int world)
      : rank_text(std::to_string(rank)),
        world_text(std::to_string(world)),
        rank_variable("RANK", rank_text.c_str()),
        world_variable("WORLD_SIZE", world_text.c_str()),
        local_rank_variable("LOCAL_RANK", rank_text.c_str()),
        local_world_variable("LOCAL_WORLD_SIZE", world_text.c_str()) {}
  std::string rank_text, world_text;
  accel_test::scoped_variable rank_variable, world_variable, local_rank_variable, local_world_variable;
};

/// Stands `barrier` in for the process group's for the scope (an empty one: no process group).
struct scoped_barrier {
  explicit scoped_barrier(std::function<void()> barrier)
      : saved(accel::detail::exchange_process_barrier(std::move(barrier))) {}
  ~scoped_barrier() { accel::detail::exchange_process_barrier(std::move(saved)); }
  scoped_barrier(const scoped_barrier&) = delete;
  scoped_barrier& operator=(const scoped_barrier&) = delete;
  std::function<void()> saved;
};

}  // namespace

TEST_CASE("J3 find_executable_batch_size: 128, 115, ... 8 for each kind of out of memory, and f's result") {
  const auto kind =
      GENERATE(out_of_memory_kind::libtorch_cpu, out_of_memory_kind::bad_alloc, out_of_memory_kind::c10_out_of_memory,
               out_of_memory_kind::cuda_error_message, out_of_memory_kind::cudnn_not_supported);
  CAPTURE(static_cast<int>(kind));
  std::vector<int> tried;
  const auto result = accel::find_executable_batch_size(
      [&](int batch_size) {
        tried.push_back(batch_size);
        if (batch_size > 8) run_out_of_memory(kind);
        return "fits at " + std::to_string(batch_size);
      },
      128);
  CHECK(tried == j3_sizes);
  CHECK(result == "fits at 8");
}

TEST_CASE("find_executable_batch_size recognises out of memory by type, and by message where no type says it") {
  auto classify = [](auto&& thrower) {
    try {
      thrower();
    } catch (...) {
      return accel::should_reduce_batch_size(std::current_exception());
    }
    FAIL("nothing thrown");
    return false;
  };
  CHECK(classify([] { run_out_of_memory(out_of_memory_kind::libtorch_cpu); }));
  CHECK(classify([] { run_out_of_memory(out_of_memory_kind::bad_alloc); }));
  CHECK(classify([] { run_out_of_memory(out_of_memory_kind::c10_out_of_memory); }));
  CHECK(classify([] { throw std::bad_array_new_length(); }));                                // a std::bad_alloc too
  CHECK_FALSE(classify([] { (void)torch::mm(torch::ones({2, 3}), torch::ones({2, 3})); }));  // a LibTorch error
  CHECK_FALSE(classify([] { throw std::runtime_error("CUDA out of memory."); }));  // not LibTorch's: not guessed at
  CHECK_FALSE(classify([] { throw 42; }));
  CHECK_FALSE(accel::should_reduce_batch_size(nullptr));
}

TEST_CASE("find_executable_batch_size lets any other error through untouched, at once") {
  int calls = 0;
  CHECK_THROWS_MATCHES(accel::find_executable_batch_size(
                           [&](int) -> int {
                             ++calls;
                             throw std::logic_error("bad configuration");
                           },
                           64),
                       std::logic_error, Catch::Message("bad configuration"));
  CHECK(calls == 1);
  CHECK_THROWS_AS(accel::find_executable_batch_size(
                      [&](int batch_size) {
                        ++calls;
                        return torch::mm(torch::ones({batch_size, 3}), torch::ones({2, 3}));  // shapes do not fit
                      },
                      16),
                  c10::Error);
  CHECK(calls == 2);
  CHECK_THROWS_MATCHES(accel::find_executable_batch_size(
                           [&](int) {
                             ++calls;
                             throw 7;
                           },
                           16),
                       int, Catch::Predicate<int>([](int thrown) { return thrown == 7; }));
  CHECK(calls == 3);
}

TEST_CASE("find_executable_batch_size: every size out of memory ends at zero with what to do") {
  std::vector<int> tried;
  try {
    accel::find_executable_batch_size(
        [&](int batch_size) {
          tried.push_back(batch_size);
          run_out_of_memory(out_of_memory_kind::libtorch_cpu);
        },
        128);
    FAIL("no error");
  } catch (const accel::batch_size_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("no executable batch size found, reached zero") &&
                             Catch::Contains("from 128 down to 1") && Catch::Contains("acc.free_memory()") &&
                             Catch::Contains("mixed precision"));
  }
  auto expected = j3_sizes;
  expected.insert(expected.end(), {7, 6, 5, 4, 3, 2, 1});
  CHECK(tried == expected);

  std::vector<int> from_one;
  CHECK_THROWS_AS(accel::find_executable_batch_size(
                      [&](int batch_size) {
                        from_one.push_back(batch_size);
                        throw std::bad_alloc();
                      },
                      1),
                  accel::batch_size_error);
  CHECK(from_one == std::vector<int>{1});
  CHECK_THROWS_WITH(accel::find_executable_batch_size([](int) {}, 0), Catch::Contains("must be at least 1"));
}

// Issue 40, item 7: the final error said every size ran out of memory when the evaluation's fixed batch did; it
// names the last out-of-memory error, and nests it.
TEST_CASE("find_executable_batch_size: the final error names the last out-of-memory error and nests it") {
  int trained = 0;
  try {
    accel::find_executable_batch_size(
        [&](int batch_size) {
          trained = batch_size;             // training at this size fits...
          accel_test::allocate_too_much();  // ...an evaluation batch of a fixed size does not
        },
        64);
    FAIL("no error");
  } catch (const accel::batch_size_error& e) {
    CHECK(trained == 1);
    CHECK_THAT(e.what(), Catch::Contains("from 64 down to 1, ran out of memory; the last: at batch size 1, ") &&
                             Catch::Contains("DefaultCPUAllocator: can't allocate memory") &&
                             Catch::Contains("(nested in this error)") && Catch::Contains("an evaluation batch"));
    try {
      std::rethrow_if_nested(e);
      FAIL("nothing nested");
    } catch (const c10::Error& nested) {
      CHECK_THAT(nested.what_without_backtrace(), Catch::Contains("DefaultCPUAllocator: can't allocate memory"));
    }
  }
}

// Issue 40, item 7: Accelerate's reduce_batch_size_fn (given the size that ran out here).
TEST_CASE("find_executable_batch_size with reduce_batch_size: its sizes, a size that does not shrink refused") {
  std::vector<int> tried;
  const auto halve = [](int batch_size) { return batch_size / 2; };
  const int fitted = accel::find_executable_batch_size(
      [&](int batch_size) {
        tried.push_back(batch_size);
        if (batch_size > 20) throw std::bad_alloc();
        return batch_size;
      },
      128, halve);
  CHECK(fitted == 16);
  CHECK(tried == std::vector<int>{128, 64, 32, 16});
  tried.clear();
  CHECK_THROWS_WITH(accel::find_executable_batch_size(
                        [&](int batch_size) {
                          tried.push_back(batch_size);
                          throw std::bad_alloc();
                        },
                        8, halve),
                    Catch::Contains("from 8 down to 1, ran out of memory") && Catch::Contains("std::bad_alloc"));
  CHECK(tried == std::vector<int>{8, 4, 2, 1});
  CHECK_THROWS_WITH(
      accel::find_executable_batch_size([](int) { throw std::bad_alloc(); }, 8, [](int size) { return size; }),
      Catch::Contains("reduce_batch_size returned 8 after batch size 8") &&
          Catch::Contains("must return a smaller batch size"));
  accel::accelerator<accel::fp32, accel::single_process> acc{{.cpu = true}};
  tried.clear();
  CHECK(accel::find_executable_batch_size(
            acc,
            [&](int batch_size) {
              tried.push_back(batch_size);
              if (batch_size > 50) throw std::bad_alloc();
              return batch_size;
            },
            100, [](int size) { return size - 30; }) == 40);
  CHECK(tried == std::vector<int>{100, 70, 40});
}

// Issue 40, item 3: PyTorch's memory_allocated / max_memory_allocated / reset_peak_memory_stats, on the CPU through
// accel's counting allocator. CTest runs each case in a process of its own, so counting is off when this one starts.
TEST_CASE(
    "memory_stats(cpu): storage counted from count_cpu_memory() on, its peak and reset, a block made before freed",
    "[memory_stats]") {
  const c10::Device cpu(c10::kCPU);
  at::Tensor made_before;
  void* raw_before = nullptr;
  if (!accel::counting_cpu_memory()) {  // always so under CTest; run with other cases, this part is skipped
    made_before = torch::ones({1000});
    raw_before = c10::GetCPUAllocator()->raw_allocate(64);
    CHECK_THROWS_WITH(accel::memory_stats(cpu), Catch::Contains("call it at the start of the program"));
  }
  accel::count_cpu_memory();
  accel::count_cpu_memory();  // once is enough; again changes nothing
  REQUIRE(accel::counting_cpu_memory());
  const auto start = accel::memory_stats(cpu);
  if (raw_before != nullptr) {
    // Blocks allocated before counting was on are freed as before, uncounted: the tensor's by its own deleter, the
    // raw block through the counting allocator now installed (LibTorch's raw_deallocate), which hands it on.
    made_before = at::Tensor();
    c10::GetCPUAllocator()->raw_deallocate(raw_before);
    CHECK(accel::memory_stats(cpu).allocated == start.allocated);
  }
  accel::reset_peak_memory_stats(cpu);
  CHECK(accel::memory_stats(cpu).peak_allocated == start.allocated);
  {
    const auto floats = torch::empty({1000});                  // 4000 bytes
    const auto doubles = torch::empty({250}, torch::kDouble);  // 2000
    const auto now = accel::memory_stats(cpu);
    CHECK(now.allocated == start.allocated + 6000);
    CHECK(now.reserved == now.allocated);  // the CPU caches nothing
  }
  const auto after = accel::memory_stats(cpu);
  CHECK(after.allocated == start.allocated);
  CHECK(after.peak_allocated == start.allocated + 6000);
  CHECK(after.peak_reserved == after.peak_allocated);
  accel::reset_peak_memory_stats(cpu);
  CHECK(accel::memory_stats(cpu).peak_allocated == start.allocated);
  if (!torch::cuda::is_available())  // no GPU here: said so, naming the device
    CHECK_THROWS_WITH(accel::memory_stats(c10::Device(c10::kCUDA, 0)),
                      Catch::Contains("no memory statistics for cuda:0"));
}

TEST_CASE("the counting allocator frees blocks it did not make through the allocator that made them, uncounted",
          "[memory_stats]") {
  using accel::detail::counting_cpu_allocator;
  c10::Allocator* libtorch = c10::GetDefaultCPUAllocator();
  // Never destroyed, as the installed one: the blocks they made may outlive them.
  auto& counter = *new counting_cpu_allocator(libtorch);
  auto& later = *new counting_cpu_allocator(&counter);  // one installed in front of it later
  void* foreign = libtorch->raw_allocate(64);
  counter.raw_deallocate(foreign);  // LibTorch's block: handed to LibTorch's deleter
  CHECK(counter.current() == 0);
  void* own = counter.raw_allocate(128);
  CHECK(counter.current() == 128);
  later.raw_deallocate(own);  // freed through the allocator installed later: still counted back to its maker
  CHECK(counter.current() == 0);
  CHECK(later.current() == 0);
  {
    const auto block = later.allocate(256);  // through both: each counts it
    CHECK(later.current() == 256);
    CHECK(counter.current() == 256);
    CHECK(block.get() == block.get_context());  // what raw_allocate requires of an allocator
  }
  CHECK(later.current() == 0);
  CHECK(counter.current() == 0);
  CHECK(counter.peak() == 256);
  counter.reset_peak();
  CHECK(counter.peak() == 0);
  CHECK(later.allocate(0).get() == nullptr);  // nothing to count
  CHECK(later.current() == 0);
}

TEST_CASE("find_executable_batch_size returns f's result by value (move-only too), or nothing for void") {
  auto owned = accel::find_executable_batch_size(
      [](int batch_size) {
        if (batch_size > 100) throw std::bad_alloc();
        return std::make_unique<int>(batch_size);
      },
      128);
  static_assert(std::is_same_v<decltype(owned), std::unique_ptr<int>>);
  CHECK(*owned == 92);  // 128 and 115 and 103 ran out
  int ran_at = 0;
  accel::find_executable_batch_size([&](int batch_size) { ran_at = batch_size; }, 10);
  CHECK(ran_at == 10);
}

TEST_CASE("find_executable_batch_size through a one-process accelerator: the same sequence, nothing to agree on") {
  accel::accelerator<accel::fp32, accel::single_process> acc{{.cpu = true}};
  std::vector<int> tried;
  const int fitted = accel::find_executable_batch_size(
      acc,
      [&](int batch_size) {
        tried.push_back(batch_size);
        if (batch_size > 8) run_out_of_memory(out_of_memory_kind::libtorch_cpu);
        return batch_size;
      },
      128);
  CHECK(fitted == 8);
  CHECK(tried == j3_sizes);
}

TEST_CASE("get_logger: WARNING by default, Python's format with Accelerate's rank prefix, every level by name") {
  accel_test::scoped_variable unset("ACCELERATE_LOG_LEVEL", nullptr);
  std::ostringstream out;
  auto log = accel::get_logger("train");
  log.set_stream(out);
  CHECK(log.level() == accel::log_level::warning);
  log.debug("d");
  log.info("i");
  log.warning("careful");
  log.error("broken");
  log.critical("down");
  CHECK(out.str() == "WARNING:train:[RANK 0] careful\nERROR:train:[RANK 0] broken\nCRITICAL:train:[RANK 0] down\n");

  out.str("");
  log.set_level(accel::log_level::debug);
  log.debug("d");
  log.info("i");
  log.log(accel::log_level::info, "by level");
  CHECK(out.str() == "DEBUG:train:[RANK 0] d\nINFO:train:[RANK 0] i\nINFO:train:[RANK 0] by level\n");

  out.str("");
  log.warning_once("deprecated");
  log.warning_once("deprecated");
  log.warning_once("other");
  CHECK(out.str() == "WARNING:train:[RANK 0] deprecated\nWARNING:train:[RANK 0] other\n");
}

TEST_CASE("get_logger: the level from the argument, else ACCELERATE_LOG_LEVEL, in any case, and a bad name refused") {
  {
    accel_test::scoped_variable level("ACCELERATE_LOG_LEVEL", "debug");
    CHECK(accel::get_logger("a").level() == accel::log_level::debug);
    CHECK(accel::get_logger("a", accel::log_level::error).level() == accel::log_level::error);
    CHECK(accel::get_logger("a", "Info").level() == accel::log_level::info);
    CHECK(accel::get_logger("a", "WARN").level() == accel::log_level::warning);
    std::ostringstream out;
    accel::get_logger("env").set_stream(out).debug("shown");
    CHECK(out.str() == "DEBUG:env:[RANK 0] shown\n");
  }
  {
    accel_test::scoped_variable level("ACCELERATE_LOG_LEVEL", "verbose");
    CHECK_THROWS_WITH(accel::get_logger("a"), Catch::Contains("unknown log level \"verbose\"") &&
                                                  Catch::Contains("ACCELERATE_LOG_LEVEL") &&
                                                  Catch::Contains("DEBUG, INFO, WARNING, ERROR or CRITICAL"));
    CHECK(accel::get_logger("a", "error").level() == accel::log_level::error);  // the argument wins, unread
  }
  CHECK_THROWS_AS(accel::get_logger("a", "loud"), std::invalid_argument);
  CHECK(accel::get_logger("a", "NOTSET").is_enabled_for(accel::log_level::debug));
}

TEST_CASE("get_logger: the main process only by default, every process with main_process_only = false") {
  accel_test::scoped_variable unset("ACCELERATE_LOG_LEVEL", nullptr);
  for (int rank : {0, 1}) {
    as_process process(rank, 2);
    std::ostringstream out;
    auto log = accel::get_logger("m", accel::log_level::info);
    log.set_stream(out);
    log.info("once");
    log.info("everywhere", {.main_process_only = false});
    const std::string r = std::to_string(rank);
    CHECK(out.str() == std::string(rank == 0 ? "INFO:m:[RANK 0] once\n" : "") + "INFO:m:[RANK " + r + "] everywhere\n");
  }
}

TEST_CASE("get_logger: in_order writes in its turn between barriers, and without a process group says what to do") {
  for (int rank : {0, 1, 2}) {
    as_process process(rank, 3);
    std::ostringstream out;
    auto log = accel::get_logger("o", accel::log_level::info);
    log.set_stream(out);
    std::vector<std::size_t> written_at_barrier;  // how much was written when each barrier was reached
    scoped_barrier counting([&] { written_at_barrier.push_back(out.str().size()); });
    log.info("turn", {.main_process_only = true, .in_order = true});  // main_process_only is ignored
    log.debug("dropped, and no barrier", {.in_order = true});
    const std::string line = "INFO:o:[RANK " + std::to_string(rank) + "] turn\n";
    CHECK(out.str() == line);
    std::vector<std::size_t> expected(3, 0);
    for (int after = rank; after < 3; ++after) expected[static_cast<std::size_t>(after)] = line.size();
    CHECK(written_at_barrier == expected);  // one barrier per process; the line written just before its own
  }
  {
    as_process process(1, 2);
    scoped_barrier none(nullptr);
    auto log = accel::get_logger("o", accel::log_level::info);
    CHECK_THROWS_WITH(log.info("x", {.in_order = true}),
                      Catch::Contains("no process group yet") && Catch::Contains("build the accelerator"));
  }
  as_process alone(0, 1);
  scoped_barrier none(nullptr);
  std::ostringstream out;
  accel::get_logger("o", accel::log_level::info).set_stream(out).info("alone", {.in_order = true});
  CHECK(out.str() == "INFO:o:[RANK 0] alone\n");  // one process needs no barrier
}

// Issue 33's device map over a LibTorch module (accel/module_tree.hpp): the description equals the hand-written tree
// of the same model, so the map is the one test_device_map.cpp (and Accelerate) expects. A hidden case, registered as
// bigmodel.device_map.torch_module.
namespace {

struct TiedHeadImpl : torch::nn::Module {
  TiedHeadImpl() : torch::nn::Module("TiedHead") {
    embed = register_module("embed", torch::nn::Embedding(10, 4));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 3; ++i) {
      auto block = std::make_shared<torch::nn::Module>("Block");
      block->register_module("attn", torch::nn::Linear(4, 4));
      block->register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})));
      blocks->push_back(block);
    }
    // The head's weight is the embedding's (as head.weight = embed.weight in Python): a tie.
    head = register_module("head", std::make_shared<torch::nn::Module>("Head"));
    head->register_parameter("weight", embed->weight);
    register_buffer("steps", torch::zeros({8}, torch::kInt64));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  std::shared_ptr<torch::nn::Module> head;
};
TORCH_MODULE(TiedHead);

}  // namespace

TEST_CASE("describe_module: names, Module::name() classes, bytes, ties and buffers of a LibTorch model",
          "[.bigmodel_device_map]") {
  const auto tree = accel::describe_module(*TiedHead());
  CHECK(tree.class_name == "TiedHead");
  REQUIRE(tree.children.size() == 3);
  CHECK(tree.buffers.size() == 1);
  CHECK(tree.buffers[0].name == "steps");
  CHECK(tree.buffers[0].element_size == 8);
  CHECK_FALSE(tree.buffers[0].floating_point);
  CHECK(tree.children[0].class_name == "torch::nn::EmbeddingImpl");
  CHECK(tree.children[1].children[2].name == "2");
  CHECK(tree.children[1].children[2].class_name == "Block");
  CHECK(tree.children[1].children[2].children[0].parameters[0].elements == 16);
  const auto& head = tree.children[2];
  REQUIRE(head.parameters.size() == 1);
  CHECK(head.parameters[0].tied_to == "embed.weight");
  CHECK(head.parameters[0].elements == 40);

  // 160 (embed) + 3 x (80 + 32) (blocks) + 64 (steps), as Accelerate maps the same torch.nn model: once the embedding
  // and the blocks' names are placed no layer is left to keep room for, so the blocks fill GPU 0 and the buffer spills.
  const accel::device_map_options options{
      .max_memory = {{accel::map_device::gpu(0), 500}, {accel::map_device::gpu(1), 1000}},
      .no_split_module_classes = {"Block"}};
  const auto map = accel::infer_auto_device_map(tree, options);
  CHECK(map == accel::device_map{{"embed", accel::map_device::gpu(0)},
                                 {"head", accel::map_device::gpu(0)},
                                 {"blocks", accel::map_device::gpu(0)},
                                 {"steps", accel::map_device::gpu(1)}});
}

namespace {
/// A rotary table registered in both blocks (as Llama's inv_freq), one layer registered twice in a list (ALBERT's
/// sharing) and a block in a shard unit whose module is named "Block".
struct SharingImpl : torch::nn::Module {
  SharingImpl() : torch::nn::Module("Sharing") {
    const auto table = torch::ones({16});
    auto shared = torch::nn::Linear(4, 4);
    layers = register_module("layers", torch::nn::ModuleList());
    layers->push_back(shared);
    layers->push_back(shared);
    for (int i = 0; i < 2; ++i) {
      auto block = std::make_shared<torch::nn::Module>("Block");
      block->register_module("attn", torch::nn::Linear(4, 4));
      block->register_buffer("inv_freq", table);
      register_module("block" + std::to_string(i), accel::shard_unit(block));
    }
  }
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(Sharing);
}  // namespace

TEST_CASE("describe_module: a buffer in several modules counts once, a module under several names is listed once",
          "[.bigmodel_device_map]") {
  const auto tree = accel::describe_module(*Sharing());
  REQUIRE(tree.children.size() == 3);
  const auto& layers = tree.children[0];
  CHECK(layers.children[1].shared_with == "layers.0");
  CHECK(layers.children[1].parameters[0].tied_to == "layers.0.weight");
  CHECK(tree.children[2].class_name == "Block");  // the unit's, its module's name
  CHECK(tree.children[2].buffers[0].tied_to == "block0.inv_freq");
  // 80 (the shared layer, once) + 2 x 80 (the blocks' Linear layers) + 64 (the table, once), as Accelerate counts.
  const auto sizes = accel::compute_module_sizes(tree);
  CHECK(sizes.total() == 80 + 160 + 64);
  CHECK_FALSE(sizes.contains("layers.1"));
  const auto map = accel::infer_auto_device_map(
      tree, {.max_memory = {{accel::map_device::gpu(0), 200}, {accel::map_device::cpu(), 1000}},
             .no_split_module_classes = {"Block"}});
  for (const auto& [name, device] : map) CHECK(name.rfind("layers.1", 0) != 0);
}
