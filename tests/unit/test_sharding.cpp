// Sharding (accel::views::shard) against Accelerate's BatchSamplerShard: the reference cases of groups A and C
// on simulated processes (options set by hand), a sweep of configurations checked against the rule they all
// follow, tensor batches against index batches, data_loader, split_between_processes (G3) and bad input.
#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "support.hpp"

namespace {

using index_batch = std::vector<std::int64_t>;
using batches = std::vector<index_batch>;

/// range(n) in batches of b, as a BatchSampler over a SequentialSampler.
batches batch_sampler(std::int64_t n, std::int64_t b, bool drop_last = false) {
  batches out;
  for (std::int64_t start = 0; start < n; start += b) {
    if (drop_last && start + b > n) break;
    index_batch batch;
    for (auto i = start; i < std::min(n, start + b); ++i) batch.push_back(i);
    out.push_back(batch);
  }
  return out;
}

/// What process r of p gets.
template <class Range>
auto shard_of(Range&& input, int p, int r, accel::shard_options o) {
  o.num_processes = p;
  o.process_index = r;
  std::vector<std::remove_cvref_t<decltype(*std::begin(input))>> out;
  for (auto&& b : input | accel::views::shard(o)) out.push_back(b);
  return out;
}

accel::shard_options opts(std::int64_t b, bool drop_last = false, bool even = true, bool split = false) {
  return {.batch_size = b, .drop_last = drop_last, .split_batches = split, .even_batches = even};
}

index_batch flat(const batches& bs) {
  index_batch out;
  for (const auto& b : bs) out.insert(out.end(), b.begin(), b.end());
  return out;
}

index_batch iota(std::int64_t from, std::int64_t to) {
  index_batch v(static_cast<std::size_t>(to - from));
  std::iota(v.begin(), v.end(), from);
  return v;
}

}  // namespace

TEST_CASE("A1-A6 whole batches round robin, P=2", "[shard]") {
  auto s = [](std::int64_t n, accel::shard_options o, int r) {
    return shard_of(batch_sampler(n, 3, o.drop_last), 2, r, o);
  };
  // A1
  for (bool drop : {false, true}) {
    CHECK(s(24, opts(3, drop), 0) == batches{{0, 1, 2}, {6, 7, 8}, {12, 13, 14}, {18, 19, 20}});
    CHECK(s(24, opts(3, drop), 1) == batches{{3, 4, 5}, {9, 10, 11}, {15, 16, 17}, {21, 22, 23}});
  }
  // A2
  CHECK(s(21, opts(3), 0).back() == index_batch{18, 19, 20});
  CHECK(s(21, opts(3), 1).back() == index_batch{0, 1, 2});
  CHECK(s(21, opts(3, true), 0) == batches{{0, 1, 2}, {6, 7, 8}, {12, 13, 14}});
  CHECK(s(21, opts(3, true), 1) == batches{{3, 4, 5}, {9, 10, 11}, {15, 16, 17}});
  // A3
  CHECK(s(22, opts(3), 0).back() == index_batch{18, 19, 20});
  CHECK(s(22, opts(3), 1).back() == index_batch{21, 0, 1});
  CHECK(s(22, opts(3, true), 0).size() == 3);
  CHECK(s(22, opts(3, true), 1).size() == 3);
  // A4
  CHECK(s(20, opts(3), 0).back() == index_batch{18, 19, 0});
  CHECK(s(20, opts(3), 1).back() == index_batch{1, 2, 3});
  CHECK(s(20, opts(3, true), 0).size() == 3);
  // A5: less than one global batch
  CHECK(s(2, opts(3), 0) == batches{{0, 1, 0}});
  CHECK(s(2, opts(3), 1) == batches{{1, 0, 1}});
  CHECK(s(2, opts(3, true), 0).empty());
  CHECK(s(2, opts(3, true), 1).empty());
  // A6: even_batches = false
  CHECK(s(21, opts(3, false, false), 1).size() == 3);
  CHECK(s(22, opts(3, false, false), 1).back() == index_batch{21});
  CHECK(s(20, opts(3, false, false), 0).back() == index_batch{18, 19});
  CHECK(s(20, opts(3, false, false), 1).size() == 3);
  CHECK(s(2, opts(3, false, false), 0) == batches{{0, 1}});
  CHECK(s(2, opts(3, false, false), 1).empty());
}

TEST_CASE("A7 A8 A11 split_batches, P=2", "[shard]") {
  auto s = [](std::int64_t n, accel::shard_options o, int r) {
    return shard_of(batch_sampler(n, 4, o.drop_last), 2, r, o);
  };
  CHECK(s(24, opts(4, false, true, true), 0) == batches{{0, 1}, {4, 5}, {8, 9}, {12, 13}, {16, 17}, {20, 21}});
  CHECK(s(24, opts(4, false, true, true), 1) == batches{{2, 3}, {6, 7}, {10, 11}, {14, 15}, {18, 19}, {22, 23}});
  CHECK(s(22, opts(4, false, true, true), 1).back() == index_batch{0, 1});
  CHECK(s(21, opts(4, false, true, true), 0).back() == index_batch{20, 0});
  CHECK(s(21, opts(4, false, true, true), 1).back() == index_batch{1, 2});
  CHECK(s(2, opts(4, false, true, true), 0) == batches{{0, 1}});
  CHECK(s(2, opts(4, false, true, true), 1) == batches{{0, 1}});
  for (std::int64_t n : {22, 21}) {
    CHECK(s(n, opts(4, true, true, true), 0).size() == 5);
    CHECK(s(n, opts(4, true, true, true), 1).size() == 5);
  }
  // A8: split without even_batches
  CHECK(s(22, opts(4, false, false, true), 1).size() == 5);
  CHECK(s(21, opts(4, false, false, true), 0).back() == index_batch{20});
  CHECK(s(21, opts(4, false, false, true), 1).size() == 5);
  CHECK(s(2, opts(4, false, false, true), 0) == batches{{0, 1}});
  CHECK(s(2, opts(4, false, false, true), 1).empty());
  // A11
  CHECK_THROWS_WITH(accel::views::shard({.batch_size = 3, .num_processes = 2, .split_batches = true}),
                    Catch::Contains("batch_size (3) to be a multiple of num_processes (2)"));
  CHECK_THROWS_WITH(accel::views::shard({.num_processes = 2, .split_batches = true}),
                    Catch::Contains("split_batches needs batch_size"));
}

TEST_CASE("A9 batches of varying size", "[shard]") {
  const batches varying = {{0, 1, 2}, {3, 4}, {5, 6, 7, 8}, {9, 10, 11}, {12, 13}};
  accel::shard_options uneven{.even_batches = false};
  CHECK(shard_of(varying, 2, 0, uneven) == batches{{0, 1, 2}, {5, 6, 7, 8}, {12, 13}});
  CHECK(shard_of(varying, 2, 1, uneven) == batches{{3, 4}, {9, 10, 11}});
  CHECK(shard_of(varying, 2, 0, {}) == batches{{0, 1, 2}, {5, 6, 7, 8}, {12, 13}});
  CHECK(shard_of(varying, 2, 1, {}) == batches{{3, 4}, {9, 10, 11}, {0, 1, 2}});
  const batches seven = {{0}, {1, 2}, {3, 4, 5}, {6}, {7, 8}, {9, 10, 11}, {12, 13}};
  CHECK(shard_of(seven, 3, 1, {}).back() == index_batch{0});
  CHECK(shard_of(seven, 3, 2, {}).back() == index_batch{1, 2});
}

TEST_CASE("A10 and group C", "[shard]") {
  auto s = [](std::int64_t n, std::int64_t b, int p, int r, accel::shard_options o) {
    return shard_of(batch_sampler(n, b, o.drop_last), p, r, o);
  };
  CHECK(s(10, 4, 2, 0, opts(4)) == batches{{0, 1, 2, 3}, {8, 9, 0, 1}});
  CHECK(s(10, 4, 2, 1, opts(4)) == batches{{4, 5, 6, 7}, {2, 3, 4, 5}});
  CHECK(s(10, 4, 2, 0, opts(4, false, false)) == batches{{0, 1, 2, 3}, {8, 9}});
  CHECK(s(10, 4, 2, 1, opts(4, false, false)).size() == 1);
  CHECK(s(10, 4, 2, 0, opts(4, false, true, true)) == batches{{0, 1}, {4, 5}, {8, 9}});
  CHECK(s(10, 4, 2, 1, opts(4, false, true, true)) == batches{{2, 3}, {6, 7}, {0, 1}});
  CHECK(s(10, 4, 3, 2, opts(4)) == batches{{8, 9, 0, 1}});
  CHECK(s(5, 2, 4, 2, opts(2)) == batches{{4, 0}});
  CHECK(s(5, 2, 4, 3, opts(2)) == batches{{1, 2}});
  // C: an iterable of range(10) in batches of 4, flattened per process
  CHECK(flat(s(10, 4, 2, 0, opts(4))) == index_batch{0, 1, 2, 3, 8, 9, 0, 1});
  CHECK(flat(s(10, 4, 2, 1, opts(4))) == index_batch{4, 5, 6, 7, 2, 3, 4, 5});
  CHECK(flat(s(10, 4, 2, 0, opts(4, false, true, true))) == index_batch{0, 1, 4, 5, 8, 9});
  CHECK(flat(s(10, 4, 2, 1, opts(4, false, true, true))) == index_batch{2, 3, 6, 7, 0, 1});
  CHECK(flat(s(10, 4, 2, 0, opts(4, true))) == iota(0, 4));
  CHECK(flat(s(10, 4, 2, 1, opts(4, true))) == iota(4, 8));
  CHECK(flat(s(3, 4, 2, 0, opts(4))) == index_batch{0, 1, 2, 0});
  CHECK(flat(s(3, 4, 2, 1, opts(4))) == index_batch{1, 2, 0, 1});
}

TEST_CASE("every configuration: the processes' batches, round by round, are the data then the padding", "[shard]") {
  // The rule every case above follows: reading the processes' batches round by round (process 0's k-th batch,
  // process 1's k-th, ...) gives the samples in order, then, with even_batches, padding that cycles through the
  // first global batch's samples up to a whole number of global batches; without it, nothing more; with
  // drop_last, only the complete global batches.
  for (int p = 1; p <= 4; ++p)
    for (std::int64_t b = 1; b <= 5; ++b)
      for (std::int64_t n = 1; n <= 3 * p * b + 2; ++n)
        for (bool split : {false, true})
          for (bool even : {false, true})
            for (bool drop : {false, true}) {
              if (split && b % p != 0) continue;
              const auto o = opts(b, drop, even, split);
              const auto input = batch_sampler(n, b, drop);
              std::vector<batches> per;
              for (int r = 0; r < p; ++r) per.push_back(shard_of(input, p, r, o));
              index_batch rounds;
              for (std::size_t k = 0; k < per[0].size() || k < per.back().size(); ++k)
                for (int r = 0; r < p; ++r)
                  if (k < per[r].size()) rounds.insert(rounds.end(), per[r][k].begin(), per[r][k].end());
              const std::int64_t global = split ? b : p * b;
              index_batch expected = iota(0, drop && p > 1 ? n / global * global : n);
              if (drop && p == 1) expected = flat(input);  // one process: the batches as they are
              if (even && !drop && n % global != 0 && p > 1) {
                const auto first = std::min(n, global);
                for (std::int64_t i = 0; expected.size() % global != 0; ++i) expected.push_back(i % first);
              }
              INFO("P " << p << " B " << b << " N " << n << " split " << split << " even " << even << " drop " << drop);
              CHECK(rounds == expected);
              for (int r = 0; r < p; ++r) {  // size() says how many batches a pass gives
                auto o_r = o;
                o_r.num_processes = p;
                o_r.process_index = r;
                const auto size = accel::shard_view<const batches&>(input, o_r).size();
                if (split && !even && !drop)  // a short last batch may leave late processes no slice
                  CHECK(size >= per[r].size());
                else
                  CHECK(size == per[r].size());
              }
              if (even)  // every process the same number of batches
                for (int r = 1; r < p; ++r) CHECK(per[r].size() == per[0].size());
            }
}

TEST_CASE("tensor batches, pairs of them and Examples give the same samples as index batches", "[shard]") {
  for (int p : {2, 3}) {
    const auto o = opts(4);
    const auto indices = batch_sampler(11, 4);
    std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs;
    std::vector<torch::data::Example<>> examples;
    for (const auto& b : indices) {
      auto t = torch::tensor(b);
      pairs.emplace_back(t, t * 10);
      examples.push_back({t.to(torch::kFloat), t});
    }
    for (int r = 0; r < p; ++r) {
      auto expected = shard_of(indices, p, r, o);
      auto got = shard_of(pairs, p, r, o);
      auto got_examples = shard_of(examples, p, r, o);
      REQUIRE(got.size() == expected.size());
      for (std::size_t k = 0; k < got.size(); ++k) {
        CHECK(torch::equal(got[k].first, torch::tensor(expected[k])));
        CHECK(torch::equal(got[k].second, torch::tensor(expected[k]) * 10));
        CHECK(torch::equal(got_examples[k].target, torch::tensor(expected[k])));
      }
    }
  }
}

TEST_CASE("data_loader: batches, shuffling by (seed, epoch), drop_last", "[shard][loader]") {
  std::vector<std::int64_t> samples = iota(0, 10);
  accel::data_loader loader(samples, {.batch_size = 4});
  std::vector<std::vector<std::int64_t>> seen;
  for (auto&& b : loader) seen.push_back(b);
  CHECK(seen == batches{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}});
  CHECK(loader.epoch() == 1);  // a pass is an epoch
  accel::data_loader shuffled(samples, {.batch_size = 10, .shuffle = true, .seed = 3});
  accel::data_loader same(samples, {.batch_size = 10, .shuffle = true, .seed = 3});
  auto first = *shuffled.begin();
  auto again = *same.begin();
  CHECK(first == again);              // every process draws the same permutation
  for (auto&& b : shuffled) (void)b;  // finish epoch 0
  auto second = *shuffled.begin();
  CHECK(second != first);  // a new epoch reshuffles
  std::sort(second.begin(), second.end());
  CHECK(second == samples);
  shuffled.set_epoch(0);
  CHECK(*shuffled.begin() == first);
  accel::data_loader dropping(samples, {.batch_size = 4, .drop_last = true});
  CHECK(accel_test::count_batches(dropping) == 2);
}

TEST_CASE("data_loader over a LibTorch dataset stacks Examples", "[shard][loader]") {
  struct squares : torch::data::datasets::Dataset<squares> {
    torch::data::Example<> get(std::size_t i) override {
      return {torch::full({2}, double(i)), torch::full({1}, double(i * i))};
    }
    torch::optional<std::size_t> size() const override { return 5; }
  };
  accel::data_loader loader(squares{}, {.batch_size = 2});
  auto batch = *loader.begin();
  CHECK(batch.data.sizes() == torch::IntArrayRef({2, 2}));
  CHECK(torch::equal(batch.target, torch::tensor({{0.0f}, {1.0f}})));
}

TEST_CASE("G3 split_between_processes", "[shard]") {
  accel::accelerator<> acc{{.cpu = true}};
  for (int p = 1; p <= 4; ++p) {
    std::size_t total = 0;
    for (int r = 0; r < p; ++r) {
      auto part = accel::detail::split_between_processes(iota(0, 17), r, p, false);
      CHECK(part.size() == static_cast<std::size_t>(17 / p + (r < 17 % p ? 1 : 0)));
      total += part.size();
      auto padded = accel::detail::split_between_processes(iota(0, 17), r, p, true);
      CHECK(padded.size() == static_cast<std::size_t>((17 + p - 1) / p));
    }
    CHECK(total == 17);
  }
  std::map<std::string, std::vector<std::int64_t>> dict{{"a", iota(1, 9)}};
  CHECK(accel::detail::split_between_processes(dict, 0, 2, false).at("a") == iota(1, 5));
  CHECK(accel::detail::split_between_processes(dict, 1, 2, false).at("a") == iota(5, 9));
  // Padding repeats the input's last element, as Accelerate (`result += [inputs[-1]] * ...`): 5 items on 4 processes.
  const std::vector<std::vector<std::int64_t>> padded_parts{{0, 1}, {2, 4}, {3, 4}, {4, 4}};
  for (int r = 0; r < 4; ++r) CHECK(accel::detail::split_between_processes(iota(0, 5), r, 4, true) == padded_parts[r]);
  CHECK(accel::detail::split_between_processes(iota(0, 2), 3, 4, true) == std::vector<std::int64_t>{1});
  CHECK(torch::equal(accel::detail::split_between_processes(torch::arange(5), 1, 4, true), torch::tensor({2, 4})));
  auto rows = torch::arange(8).reshape({2, 4});
  CHECK(torch::equal(accel::detail::split_between_processes(rows, 1, 2, false), rows.narrow(0, 1, 1)));
  CHECK(acc.split_between_processes(iota(0, 3)) == iota(0, 3));  // one process: everything
}

TEST_CASE("bad input: an empty dataset, batch_size 0, a process index out of range", "[shard]") {
  std::vector<std::int64_t> nothing;
  CHECK_THROWS_WITH(accel::data_loader(nothing, {.batch_size = 2}), Catch::Contains("the dataset is empty"));
  CHECK_THROWS_WITH(accel::data_loader(iota(0, 3), {.batch_size = 0}),
                    Catch::Contains("batch_size = 0 must be at least 1"));
  CHECK_THROWS_WITH(accel::views::shard({.batch_size = 0}), Catch::Contains("batch_size = 0 must be at least 1"));
  CHECK_THROWS_WITH(accel::views::shard({.num_processes = 2, .process_index = 2}),
                    Catch::Contains("process_index = 2 is not a process of 2"));
  CHECK(shard_of(batches{}, 2, 0, opts(3)).empty());  // an empty range of batches: nothing, no hang
}

TEST_CASE("a batch of the wrong size is refused, not silently lost", "[shard]") {
  const batches uneven = {{0, 1, 2}, {3, 4}, {5, 6, 7}};
  CHECK_THROWS_WITH(shard_of(uneven, 2, 0, opts(3)), Catch::Contains("batch 1 has 2 samples where 3 are expected") &&
                                                         Catch::Contains("only the last batch may be short"));
  CHECK_THROWS_WITH(shard_of(batches{{0, 1}, {2, 3, 4}}, 2, 0, opts(2)),
                    Catch::Contains("batch 1 has 3 samples where 2"));
}

TEST_CASE("a data loader's passes: nested ones are safe, skipped batches are never read", "[shard][loader]") {
  struct counting {
    std::vector<std::int64_t> samples = iota(0, 12);
    mutable int reads = 0;
    std::size_t size() const { return samples.size(); }
    std::int64_t get(std::size_t i) const {
      ++reads;
      return samples[i];
    }
  };
  counting dataset;
  accel::data_loader loader(dataset, {.batch_size = 4});
  int outer = 0;
  for (auto&& b : loader) {
    ++outer;
    CHECK(accel_test::count_batches(loader) == 3);  // a whole pass inside a pass
    (void)b;
  }
  CHECK(outer == 3);
  accel::accelerator<> acc{{.cpu = true}};
  auto batches = acc.prepare(loader);
  dataset.reads = 0;
  acc.skip_first_batches(batches, 2);
  std::vector<std::vector<std::int64_t>> seen;
  for (auto&& b : batches) seen.push_back(b);
  CHECK(seen == std::vector<std::vector<std::int64_t>>{{8, 9, 10, 11}});
  CHECK(dataset.reads == 4);  // only the batch that was yielded
}
