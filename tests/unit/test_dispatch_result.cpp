// accel::dispatch returns what the user's function returns: values (moved out of the accelerator's scope before it
// ends), references and void. Issue: it returned a reference to a local that was already destroyed (a returned
// batch size came back as -755914244). Besides accel_tests, this file is built alone with AddressSanitizer
// (accel_dispatch_asan), which reports any read of the destroyed result.
#include <catch2/catch.hpp>

#include "accel_headers.hpp"

#include <string>
#include <type_traits>

namespace {

/// fp32 on one process, no accumulation: the second configuration fits, so the first is rejected on the way.
const accel::run_config fp32_run{.mixed_precision = "no", .gradient_accumulation_steps = 1, .num_processes = 1};
using two_configs = accel::configs<accel::accelerator<accel::bf16>, accel::accelerator<>>;
const accel::options on_cpu{.cpu = true};

/// A value with a destructor and heap memory: a result read after its destruction is garbage, or an ASan error.
struct tracked {
  explicit tracked(std::string t) : text(std::move(t)) { ++alive; }
  tracked(tracked&& other) noexcept : text(std::move(other.text)) { ++alive; }
  tracked(const tracked& other) : text(other.text) { ++alive; }
  ~tracked() { --alive; }
  std::string text;
  static inline int alive = 0;
};

}  // namespace

TEST_CASE("dispatch returns a value: an int, a string, a type with a destructor", "[dispatch]") {
  const int batch_size = accel::dispatch<two_configs>(fp32_run, [](auto&) { return 4096; }, on_cpu);
  CHECK(batch_size == 4096);
  static_assert(std::is_same_v<decltype(accel::dispatch<two_configs>(fp32_run, [](auto&) { return 1; })), int>);

  const std::string long_text(200, 'x');  // on the heap, not in the string's small buffer
  CHECK(accel::dispatch<two_configs>(fp32_run, [&](auto&) { return long_text; }, on_cpu) == long_text);

  {
    tracked result = accel::dispatch<two_configs>(
        fp32_run, [&](auto& acc) { return tracked(long_text + std::to_string(acc.num_processes())); }, on_cpu);
    CHECK(result.text == long_text + "1");
    CHECK(tracked::alive == 1);  // only the caller's: every temporary inside dispatch is gone
  }
  CHECK(tracked::alive == 0);
}

TEST_CASE("dispatch returns a reference as it is, and void", "[dispatch]") {
  int counter = 0;
  int& same = accel::dispatch<two_configs>(fp32_run, [&](auto&) -> int& { return counter; }, on_cpu);
  CHECK(&same == &counter);
  static_assert(
      std::is_same_v<decltype(accel::dispatch<two_configs>(fp32_run, [&](auto&) -> int& { return counter; })), int&>);
  const std::string text = "kept";
  const std::string& view =
      accel::dispatch<two_configs>(fp32_run, [&](auto&) -> const std::string& { return text; }, on_cpu);
  CHECK(&view == &text);

  int calls = 0;
  accel::dispatch<two_configs>(fp32_run, [&](auto&) { ++calls; }, on_cpu);
  CHECK(calls == 1);
  static_assert(std::is_void_v<decltype(accel::dispatch<two_configs>(fp32_run, [](auto&) {}))>);
}
