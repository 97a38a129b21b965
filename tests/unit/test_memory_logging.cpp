// find_executable_batch_size (case J3 of ../shared/reference/accelerate-semantics.md), should_reduce_batch_size, and
// the process-aware logger, on one process (the launcher's variables set by hand where a test plays another process).
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
