// accel::data_loader's workers (the same batches in the same order whatever their number and timing, at most
// num_workers * prefetch_factor batches ahead, a failing sample named at its batch, no thread left behind) and
// range-v3 pipelines through accel's views.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <ranges>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include <range/v3/range/conversion.hpp>
#include <range/v3/view/chunk.hpp>
#include <range/v3/view/cycle.hpp>
#include <range/v3/view/enumerate.hpp>
#include <range/v3/view/take.hpp>
#include <range/v3/view/transform.hpp>
#include <range/v3/view/zip.hpp>

#include <accel/progress.hpp>

#include "support.hpp"

namespace {

using namespace std::chrono_literals;

/// Examples whose contents depend on the index alone (random, from a generator seeded by it), taking a varying
/// time to load so that the workers finish out of order.
struct jittery : torch::data::datasets::Dataset<jittery> {
  std::size_t samples = 23;
  std::chrono::microseconds pause{200};
  std::atomic<int> calls{0};
  std::atomic<int> fail_at{-1};
  jittery() = default;
  jittery(std::size_t n, std::chrono::microseconds p) : samples(n), pause(p) {}

  torch::data::Example<> get(std::size_t i) override {
    const auto call = calls++;
    if (static_cast<int>(i) == fail_at.load()) throw std::runtime_error("record " + std::to_string(i) + " is corrupt");
    std::this_thread::sleep_for(pause * static_cast<int>((i * 7 + static_cast<std::size_t>(call) * 3) % 5));
    auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(i));
    return {torch::randn({3}, generator), torch::tensor(static_cast<std::int64_t>(i))};
  }
  torch::optional<std::size_t> size() const override { return samples; }
};

using example_batch = torch::data::Example<>;

std::vector<example_batch> epochs_of(jittery& dataset, accel::loader_options options, int epochs) {
  accel::data_loader loader(dataset, options);
  std::vector<example_batch> out;
  for (int e = 0; e < epochs; ++e)
    for (auto&& batch : loader) out.push_back(batch);
  return out;
}

void check_same(const std::vector<example_batch>& got, const std::vector<example_batch>& expected) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    INFO("batch " << k);
    CHECK(torch::equal(got[k].data, expected[k].data));
    CHECK(torch::equal(got[k].target, expected[k].target));
  }
}

/// Threads of this process, counted by the kernel.
std::size_t thread_count() { return accel::detail::directory_entries("/proc/self/task").size(); }

/// Waits (up to 30 s) until `value` stops changing for 100 ms, and returns it.
int settled(const std::atomic<int>& value) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  int last = value.load();
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    const int now = value.load();
    if (now == last) return now;
    last = now;
  }
  return last;
}

}  // namespace

TEST_CASE("data_loader workers: 0, 1, 2 and 4 give the same batches bit for bit over 3 shuffled epochs",
          "[loader][workers]") {
  jittery dataset;
  const accel::loader_options in_loop{.batch_size = 5, .shuffle = true, .seed = 9};
  const auto expected = epochs_of(dataset, in_loop, 3);
  REQUIRE(expected.size() == 15);  // 23 samples: 4 full batches and one of 3, per epoch
  for (int workers : {1, 2, 4}) {
    for (bool persistent : {false, true}) {
      for (int prefetch : {1, 2, 3}) {
        INFO(workers << " workers, prefetch_factor " << prefetch << (persistent ? ", persistent" : ""));
        auto options = in_loop;
        options.num_workers = workers;
        options.prefetch_factor = prefetch;
        options.persistent_workers = persistent;
        check_same(epochs_of(dataset, options, 3), expected);
      }
    }
  }
  // Prepared (one process), with non_blocking placement, a data loader with workers yields the same batches.
  accel::accelerator<> acc{{.cpu = true, .non_blocking = true}};
  accel::data_loader loader(dataset, {.batch_size = 5, .shuffle = true, .seed = 9, .num_workers = 2});
  auto batches = acc.prepare(loader);
  std::vector<example_batch> prepared;
  for (int e = 0; e < 3; ++e)
    for (auto&& batch : batches) prepared.push_back(batch);
  check_same(prepared, expected);
}

TEST_CASE("data_loader workers load at most num_workers * prefetch_factor batches ahead of the one in use",
          "[loader][workers]") {
  jittery dataset(60, 0us);
  accel::data_loader loader(dataset, {.batch_size = 3, .num_workers = 2, .prefetch_factor = 2});
  auto it = loader.begin();
  CHECK(dataset.calls == 0);  // nothing is loaded before a batch is used
  CHECK(torch::equal((*it).target, torch::tensor({0, 1, 2}, torch::kLong)));
  CHECK(settled(dataset.calls) == 3 * (1 + 2 * 2));  // the batch in use and 4 ahead, no more
  ++it;
  CHECK(torch::equal((*it).target, torch::tensor({3, 4, 5}, torch::kLong)));
  CHECK(settled(dataset.calls) == 3 * (2 + 2 * 2));
}

TEST_CASE("a sample that fails to load is named at the batch it belongs to, with or without workers",
          "[loader][workers]") {
  for (int workers : {0, 1, 2, 4}) {
    INFO(workers << " workers");
    jittery dataset(40, 50us);
    dataset.fail_at = 17;
    accel::data_loader loader(dataset, {.batch_size = 4, .num_workers = workers});
    std::vector<std::int64_t> seen;
    auto load_all = [&] {
      for (auto&& batch : loader)
        for (auto i : std::vector<std::int64_t>(batch.target.data_ptr<std::int64_t>(),
                                                batch.target.data_ptr<std::int64_t>() + batch.target.numel()))
          seen.push_back(i);
    };
    CHECK_THROWS_WITH(load_all(),
                      Catch::Contains("accel::data_loader: loading sample 17 failed: record 17 is corrupt"));
    CHECK(seen.size() == 16);  // the 4 batches before sample 17's arrived, in order
    CHECK(std::is_sorted(seen.begin(), seen.end()));
    try {  // the dataset's own exception stays nested inside
      load_all();
    } catch (const std::runtime_error& e) {
      CHECK_THROWS_WITH(std::rethrow_if_nested(e), "record 17 is corrupt");
    }
  }
  std::vector<at::Tensor> ragged{torch::zeros({2}), torch::zeros({3})};
  accel::data_loader uneven(ragged, {.batch_size = 2, .num_workers = 1});
  CHECK_THROWS_WITH(*uneven.begin(), Catch::Contains("collating the batch of samples 0, ... failed"));
}

TEST_CASE("1000 data loaders with workers, destroyed mid-epoch, leave no thread behind", "[loader][workers]") {
  jittery dataset(64, 20us);
  {  // whatever threads LibTorch starts once, before counting
    accel::data_loader warm_up(dataset, {.batch_size = 4, .shuffle = true, .num_workers = 2});
    (void)*warm_up.begin();
  }
  const auto before = thread_count();
  std::size_t most = 0;
  for (int k = 0; k < 1000; ++k) {
    accel::data_loader loader(dataset, {.batch_size = 4,
                                        .shuffle = true,
                                        .seed = static_cast<std::uint64_t>(k),
                                        .num_workers = 1 + k % 4,
                                        .persistent_workers = k % 2 == 0});
    int used = 0;
    for (auto&& batch : loader) {
      (void)batch;
      if (++used == 1 + k % 3) break;  // mid-epoch, with loads queued and running
    }
    most = std::max(most, thread_count());
  }
  CHECK(most > before);                                          // the workers were there
  const auto deadline = std::chrono::steady_clock::now() + 10s;  // a thread that has returned may still be exiting
  while (thread_count() != before && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  CHECK(thread_count() == before);
}

TEST_CASE("data_loader workers never read batches passed over before the first one used", "[loader][workers]") {
  struct recording {
    std::vector<std::int64_t> samples = std::vector<std::int64_t>(12);
    mutable std::mutex mutex;
    mutable std::set<std::size_t> read;
    std::size_t size() const { return samples.size(); }
    std::int64_t get(std::size_t i) const {
      std::lock_guard lock(mutex);
      read.insert(i);
      return static_cast<std::int64_t>(i);
    }
  };
  recording dataset;
  accel::data_loader loader(dataset, {.batch_size = 4, .num_workers = 2});
  accel::accelerator<> acc{{.cpu = true}};
  auto batches = acc.prepare(loader);
  acc.skip_first_batches(batches, 2);
  std::vector<std::vector<std::int64_t>> seen;
  for (auto&& b : batches) seen.push_back(b);
  CHECK(seen == std::vector<std::vector<std::int64_t>>{{8, 9, 10, 11}});
  CHECK(dataset.read == std::set<std::size_t>{8, 9, 10, 11});
}

TEST_CASE("data_loader's worker options are checked", "[loader][workers]") {
  std::vector<std::int64_t> samples(8);
  CHECK_THROWS_WITH(accel::data_loader(samples, {.num_workers = -1}), Catch::Contains("num_workers = -1 must be 0"));
  CHECK_THROWS_WITH(accel::data_loader(samples, {.num_workers = 2, .prefetch_factor = 0}),
                    Catch::Contains("prefetch_factor = 0 must be at least 1"));
  CHECK_THROWS_WITH(accel::data_loader(samples, {.persistent_workers = true}),
                    Catch::Contains("persistent_workers needs num_workers > 0"));
}

// range-v3 pipelines: accel's views between range-v3's and std's, on either side.

TEST_CASE("range-v3 views feed accel::views::shard: chunk, cycle and take, as index batches would",
          "[loader][pipeline]") {
  std::vector<std::int64_t> samples(22);
  std::iota(samples.begin(), samples.end(), 0);
  using batches = std::vector<std::vector<std::int64_t>>;
  auto shard_for = [](int r) { return accel::views::shard({.batch_size = 4, .num_processes = 2, .process_index = r}); };
  batches first, second;
  for (auto&& b : samples | ranges::views::chunk(4) | shard_for(0)) first.push_back(b);
  for (auto&& b : samples | ranges::views::chunk(4) | shard_for(1)) second.push_back(b);
  // A3's rule for N = 22, B = 4: the last round is completed from the start.
  CHECK(first == batches{{0, 1, 2, 3}, {8, 9, 10, 11}, {16, 17, 18, 19}});
  CHECK(second == batches{{4, 5, 6, 7}, {12, 13, 14, 15}, {20, 21, 0, 1}});
  batches cycled;
  for (auto&& b : samples | ranges::views::cycle | ranges::views::take(30) | ranges::views::chunk(8) |
                      accel::views::shard({.batch_size = 8, .num_processes = 2, .process_index = 1}))
    cycled.push_back(b);
  CHECK(cycled == batches{{8, 9, 10, 11, 12, 13, 14, 15}, {2, 3, 4, 5, 6, 7, 0, 1}});
  // And out of it, range-v3's views again (a named view: range-v3 pipes only its own views as rvalues), or std's.
  auto mine = samples | ranges::views::chunk(4) | shard_for(1);
  std::vector<std::size_t> sizes;
  for (auto n : mine | ranges::views::transform([](const auto& b) { return b.size(); }) | ranges::views::take(2))
    sizes.push_back(n);
  CHECK(accel_test::count_batches(samples | ranges::views::chunk(4) | shard_for(1) | std::views::take(2)) == 2);
  CHECK(sizes == std::vector<std::size_t>{4, 4});
}

TEST_CASE("range-v3's zip and std::tuple samples: pairs and tuples are collated element by element",
          "[loader][pipeline]") {
  std::vector<at::Tensor> inputs, targets;
  for (int i = 0; i < 5; ++i) {
    inputs.push_back(torch::full({3}, i));
    targets.push_back(torch::full({1}, 10 * i));
  }
  accel::data_loader loader(ranges::views::zip(inputs, targets), {.batch_size = 2, .num_workers = 2});
  std::vector<std::pair<at::Tensor, at::Tensor>> got;
  for (auto&& batch : loader) got.push_back(batch);
  REQUIRE(got.size() == 3);
  CHECK(torch::equal(got[1].first, torch::stack({inputs[2], inputs[3]})));
  CHECK(torch::equal(got[2].second, torch::stack({targets[4]})));
  auto triples = ranges::views::zip(inputs, targets, inputs);
  accel::data_loader three(triples, {.batch_size = 5});
  auto [a, b, c] = *three.begin();
  CHECK(torch::equal(a, torch::stack(inputs)));
  CHECK(torch::equal(b, torch::stack(targets)));
  CHECK(torch::equal(c, a));
  // std::tuple samples, as PyTorch's default_collate takes them: each element stacked (or gathered) on its own.
  std::vector<std::tuple<at::Tensor, at::Tensor, std::int64_t>> tuples;
  for (int i = 0; i < 4; ++i) tuples.emplace_back(inputs[i], targets[i], i);
  accel::data_loader by_element(tuples, {.batch_size = 4});
  auto [x, y, index] = *by_element.begin();
  CHECK(torch::equal(x, torch::stack({inputs[0], inputs[1], inputs[2], inputs[3]})));
  CHECK(torch::equal(y, torch::stack({targets[0], targets[1], targets[2], targets[3]})));
  CHECK(index == std::vector<std::int64_t>{0, 1, 2, 3});
}

TEST_CASE("a prepared range and acc.progress compose with range-v3 and std views on either side",
          "[loader][pipeline]") {
  accel::accelerator<> acc{{.cpu = true}};
  std::vector<std::int64_t> samples(10);
  std::iota(samples.begin(), samples.end(), 0);
  // A range-v3 pipeline prepared as the range of batches: chunks of samples made tensors.
  auto batches = acc.prepare(samples | ranges::views::chunk(4) | ranges::views::transform([](auto chunk) {
                               return torch::tensor(ranges::to<std::vector<std::int64_t>>(chunk));
                             }));
  std::vector<std::int64_t> sums;
  for (auto&& [i, batch] : batches | ranges::views::enumerate) {
    CHECK(batch.size(0) == (i < 2 ? 4 : 2));
    CHECK(acc.gradient_state().end_of_dataloader == (i == 2));  // the last batch is marked, through enumerate
    sums.push_back(batch.sum().item<std::int64_t>());
  }
  CHECK(sums == std::vector<std::int64_t>{6, 22, 17});
  std::vector<std::int64_t> firsts;
  for (auto first : batches | ranges::views::transform([](const at::Tensor& b) { return b[0].item<std::int64_t>(); }) |
                        ranges::views::take(2))
    firsts.push_back(first);
  CHECK(firsts == std::vector<std::int64_t>{0, 4});
  CHECK(accel_test::count_batches(batches | std::views::take(2)) == 2);
  CHECK(accel_test::count_batches(acc.progress(batches) | std::views::take(2)) == 2);
  accel::progress_options quiet;
  quiet.enabled = false;
  auto bar = acc.progress(batches, quiet);
  CHECK(accel_test::count_batches(bar | ranges::views::take(1)) == 1);
  CHECK(accel_test::count_batches(acc.progress(batches | ranges::views::take(2))) == 2);
}

// Streams of samples (ranges without a size): batched as read, shared as Accelerate's IterableDatasetShard.

namespace {
/// range(n) as a stream: no size, read front to back.
auto stream_of(int n) {
  return std::views::iota(0) | std::views::take_while([n](int i) { return i < n; });
}

using int_batches = std::vector<std::vector<int>>;

/// What process r of P gets from a stream loader over range(n).
int_batches stream_shard(int n, int P, int r, std::int64_t B, bool split = false, bool drop_last = false) {
  accel::data_loader loader(stream_of(n), {.batch_size = B, .drop_last = drop_last});
  accel::sharded_stream<decltype(loader)&> mine(loader,
                                                {.num_processes = P, .process_index = r, .split_batches = split});
  int_batches out;
  for (auto&& b : mine) out.push_back(b);
  return out;
}
}  // namespace

TEST_CASE("C: a stream shared between 2 processes as IterableDatasetShard", "[loader][stream]") {
  CHECK(stream_shard(10, 2, 0, 4) == int_batches{{0, 1, 2, 3}, {8, 9, 0, 1}});
  CHECK(stream_shard(10, 2, 1, 4) == int_batches{{4, 5, 6, 7}, {2, 3, 4, 5}});
  CHECK(stream_shard(10, 2, 0, 4, /*split=*/true) == int_batches{{0, 1}, {4, 5}, {8, 9}});
  CHECK(stream_shard(10, 2, 1, 4, /*split=*/true) == int_batches{{2, 3}, {6, 7}, {0, 1}});
  CHECK(stream_shard(10, 2, 0, 4, false, /*drop_last=*/true) == int_batches{{0, 1, 2, 3}});
  CHECK(stream_shard(10, 2, 1, 4, false, /*drop_last=*/true) == int_batches{{4, 5, 6, 7}});
  CHECK(stream_shard(3, 2, 0, 4) == int_batches{{0, 1, 2, 0}});  // no full round: completed from itself
  CHECK(stream_shard(3, 2, 1, 4) == int_batches{{1, 2, 0, 1}});
  // The remainder, what gather_for_metrics keeps of the last round: known once the stream has ended.
  accel::data_loader loader(stream_of(10), {.batch_size = 4});
  accel::sharded_stream<decltype(loader)&> mine(loader, {.num_processes = 2, .process_index = 0});
  CHECK(mine.remainder() == -1);
  for (auto&& b : mine) (void)b;
  CHECK(mine.remainder() == 2);
}

TEST_CASE("a stream on one process: batches as read, the last one short, a single-pass istream works",
          "[loader][stream]") {
  accel::data_loader loader(stream_of(10), {.batch_size = 4});
  int_batches seen;
  for (auto&& b : loader) seen.push_back(b);
  CHECK(seen == int_batches{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}});
  accel::data_loader dropping(stream_of(10), {.batch_size = 4, .drop_last = true});
  CHECK(accel_test::count_batches(dropping) == 2);
  std::istringstream text("3 1 4 1 5 9 2");
  accel::data_loader numbers(std::views::istream<int>(text), {.batch_size = 3});
  int_batches read;
  for (auto&& b : numbers) read.push_back(b);
  CHECK(read == int_batches{{3, 1, 4}, {1, 5, 9}, {2}});
  // Prepared on one process, tensors collated.
  accel::accelerator<> acc{{.cpu = true}};
  accel::data_loader rows(stream_of(5) | std::views::transform([](int i) { return torch::full({2}, i); }),
                          {.batch_size = 2});
  auto batches = acc.prepare(rows);
  std::vector<std::int64_t> sizes;
  for (auto&& b : batches) sizes.push_back(b.size(0));
  CHECK(sizes == std::vector<std::int64_t>{2, 2, 1});
  CHECK_THROWS_WITH(accel::data_loader(stream_of(5), {.shuffle = true}), Catch::Contains("cannot be shuffled"));
  CHECK_THROWS_WITH(accel::data_loader(stream_of(5), {.num_workers = 2}),
                    Catch::Contains("num_workers needs random access"));
}
