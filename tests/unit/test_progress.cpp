// The progress bar: exact frames and lines under a fake clock (terminal and plain modes, unknown totals, postfix),
// what a disabled or closed bar writes (nothing), and accel::progress over vectors, pairs, unsized and move-only
// input ranges, an empty range, and a prepared range.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <concepts>
#include <memory>
#include <ranges>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <accel/progress.hpp>

#include "support.hpp"  // for the prepared range

using namespace std::chrono_literals;

namespace {

/// Where a bar under test writes, and the fake clock it reads: time moves only when the test advances it.
struct recorder {
  std::ostringstream out;
  accel::progress_clock::time_point now{};

  /// Plain lines unless a test asks for frames.
  accel::progress_options options(std::string description = "train") {
    return {.description = std::move(description), .output = &out, .redraw = false, .clock = [this] { return now; }};
  }
  accel::progress_options terminal(std::size_t total, std::size_t width) {
    auto o = options();
    o.total = total;
    o.redraw = true;
    o.width = width;
    return o;
  }
  void advance(accel::progress_clock::duration d) { now += d; }
  [[nodiscard]] std::string text() const { return out.str(); }
};

/// The frames of terminal output, each without its leading '\r' and trailing erase-to-end-of-line.
std::vector<std::string> frames(const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t start = text.find('\r'); start != std::string::npos;) {
    const auto next = text.find('\r', start + 1);
    auto frame = text.substr(start + 1, next == std::string::npos ? std::string::npos : next - start - 1);
    if (frame.ends_with('\n')) frame.pop_back();
    REQUIRE(frame.ends_with("\x1b[K"));
    frame.resize(frame.size() - 3);
    out.push_back(frame);
    start = next;
  }
  return out;
}

bool has_control_characters(const std::string& text) {
  return text.find('\r') != std::string::npos || text.find('\x1b') != std::string::npos;
}

/// An input range iterable only as non-const, whose iterator is move-only: 3, 2, 1.
struct countdown {
  int from = 3;
  struct iterator {
    using value_type = int;
    using difference_type = std::ptrdiff_t;
    std::unique_ptr<int> left;
    int operator*() const { return *left; }
    iterator& operator++() {
      --*left;
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return *left == 0; }
  };
  iterator begin() { return {std::make_unique<int>(from)}; }
  std::default_sentinel_t end() { return {}; }
};
static_assert(std::ranges::input_range<countdown> && !std::ranges::range<const countdown>);
static_assert(!std::ranges::sized_range<countdown>);
static_assert(!std::copyable<countdown::iterator>);

static_assert(std::ranges::input_range<accel::progress_view<std::vector<int>&>>);
static_assert(std::ranges::view<accel::progress_view<std::vector<int>&>>);
static_assert(std::ranges::sized_range<accel::progress_view<std::vector<int>&>>);
static_assert(std::ranges::input_range<accel::progress_view<countdown>>);
static_assert(!std::copyable<std::ranges::iterator_t<accel::progress_view<countdown>>>);
static_assert(std::same_as<std::ranges::range_reference_t<accel::progress_view<std::vector<int>&>>, int&>);

}  // namespace

TEST_CASE("plain lines every line_interval and at the end, nothing else", "[progress]") {
  recorder r;
  auto o = r.options();
  o.total = 25;
  o.line_interval = 10s;
  {
    accel::progress_bar bar(o);
    for (int i = 0; i < 25; ++i) {
      r.advance(1s);
      bar.update();
      if (i == 8) CHECK(r.text().empty());  // 9 s in: no line yet
    }
  }
  CHECK(r.text() ==
        "train: 10/25 (40%) elapsed 00:10, remaining 00:15, 1.00 it/s\n"
        "train: 20/25 (80%) elapsed 00:20, remaining 00:05, 1.00 it/s\n"
        "train: 25/25 (100%) elapsed 00:25, remaining 00:00, 1.00 it/s\n");
  CHECK_FALSE(has_control_characters(r.text()));
}

TEST_CASE("plain lines of a slow loop: hours, seconds per iteration, no repeated last line", "[progress]") {
  recorder r;
  auto o = r.options();
  o.total = 4;
  o.line_interval = 1h;
  accel::progress_bar bar(o);
  for (int i = 0; i < 3; ++i) {
    r.advance(1500s);
    bar.update();
  }
  bar.close();  // the line at 4500 s already showed 3
  CHECK(r.text() == "train: 3/4 (75%) elapsed 1:15:00, remaining 25:00, 1500.00 s/it\n");
}

TEST_CASE("terminal frames: a carriage return, rate limited, 100% and a newline at the end", "[progress]") {
  recorder r;
  {
    accel::progress_bar bar(r.terminal(4, 60));  // first frame at once
    r.advance(1s);
    bar.update();  // 1 s since the last frame: drawn
    r.advance(50ms);
    bar.update();  // 50 ms: not drawn
    r.advance(950ms);
    bar.update();  // drawn
    bar.update();  // no time passed: not drawn
    r.advance(2s);
  }  // the last frame, whatever the interval
  CHECK(r.text() ==
        "\rtrain:   0%|                        | 0/4 [00:00<?, ? it/s]\x1b[K"
        "\rtrain:  25%|####             | 1/4 [00:01<00:03, 1.00 it/s]\x1b[K"
        "\rtrain:  75%|############     | 3/4 [00:02<00:01, 1.50 it/s]\x1b[K"
        "\rtrain: 100%|#################| 4/4 [00:04<00:00, 1.00 it/s]\x1b[K\n");
  for (const auto& frame : frames(r.text())) CHECK(accel::detail::progress_text::columns(frame) == 59);
}

TEST_CASE("terminal frames fit the width: the bar takes the room left, long text is cut", "[progress]") {
  for (const std::size_t width : {30UL, 45UL, 80UL, 120UL}) {
    recorder r;
    accel::progress_bar bar(r.terminal(10, width));
    r.advance(1s);
    bar.update(5);
    for (const auto& frame : frames(r.text())) CHECK(frame.size() == width - 1);
  }
  SECTION("cut between code points") {
    recorder r;
    auto o = r.terminal(10, 20);
    o.description = "époque très longue";
    o.width = 11;
    accel::progress_bar bar(o);
    CHECK(frames(r.text()) == std::vector<std::string>{"époque trè"});
  }
  SECTION("80 columns when the output is not a terminal") {
    recorder r;
    auto o = r.terminal(10, 0);
    o.width.reset();
    accel::progress_bar bar(o);
    CHECK(frames(r.text()).at(0).size() == 79);
  }
}

TEST_CASE("the width of a terminal is asked of it, 80 columns for anything else", "[progress]") {
  using accel::detail::progress_text::terminal_width;
  const int terminal = ::posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(terminal >= 0);
  const winsize size{.ws_row = 24, .ws_col = 57, .ws_xpixel = 0, .ws_ypixel = 0};
  REQUIRE(::ioctl(terminal, TIOCSWINSZ, &size) == 0);
  CHECK(terminal_width(terminal) == 57);
  ::close(terminal);
  CHECK(terminal_width(-1) == 80);
}

TEST_CASE("unknown total: count, elapsed time and rate", "[progress]") {
  SECTION("terminal") {
    recorder r;
    auto o = r.options();
    o.redraw = true;
    {
      accel::progress_bar bar(o);
      for (int i = 0; i < 2; ++i) {
        r.advance(1s);
        bar.update();
      }
    }
    CHECK(r.text() ==
          "\rtrain: 0 [00:00, ? it/s]\x1b[K"
          "\rtrain: 1 [00:01, 1.00 it/s]\x1b[K"
          "\rtrain: 2 [00:02, 1.00 it/s]\x1b[K"
          "\rtrain: 2 [00:02, 1.00 it/s]\x1b[K\n");
  }
  SECTION("plain, without a description") {
    recorder r;
    auto o = r.options("");
    o.line_interval = 2s;
    {
      accel::progress_bar bar(o);
      for (int i = 0; i < 3; ++i) {
        r.advance(500ms);
        bar.update(2);
      }
    }
    CHECK(r.text() == "6 elapsed 00:01, 4.00 it/s\n");
  }
}

TEST_CASE("postfix: named values after the rate, numbers compact, replaced by the next call", "[progress]") {
  SECTION("plain") {
    recorder r;
    auto o = r.options();
    o.total = 2;
    accel::progress_bar bar(o);
    bar.set_postfix({{"loss", 0.123456},
                     {"lr", 3e-4},
                     {"tiny", 1e-5f},
                     {"big", 123456.7},
                     {"exact", 1234.5},
                     {"whole", 2.0},
                     {"step", 12345},
                     {"phase", "warmup"},
                     {"note", std::string("ok")}});
    r.advance(2s);
    bar.update(2);
    bar.close();
    CHECK(r.text() ==
          "train: 2/2 (100%) elapsed 00:02, remaining 00:00, 1.00 it/s, loss=0.123, lr=0.0003, tiny=1e-5, "
          "big=1.23e+5, exact=1234.5, whole=2, step=12345, phase=warmup, note=ok\n");
  }
  SECTION("terminal, inside the brackets") {
    recorder r;
    accel::progress_bar bar(r.terminal(2, 70));
    bar.set_postfix({{"loss", 1.5}, {"acc", 0.25}});
    bar.set_postfix({{"loss", 0.5}});
    r.advance(1s);
    bar.update();
    CHECK(frames(r.text()).at(1) == "train:  50%|########         | 1/2 [00:01<00:01, 1.00 it/s, loss=0.5]");
  }
}

TEST_CASE("write: a line above the bar, the frame redrawn below it", "[progress]") {
  recorder terminal;
  {
    accel::progress_bar bar(terminal.terminal(2, 60));
    bar.update();
    terminal.advance(1s);
    bar.write("step 1 saved");
  }
  CHECK(terminal.text() ==
        "\rtrain:   0%|                        | 0/2 [00:00<?, ? it/s]\x1b[K"
        "\r\x1b[Kstep 1 saved\n"
        "\rtrain:  50%|########         | 1/2 [00:01<00:01, 1.00 it/s]\x1b[K"
        "\rtrain:  50%|########         | 1/2 [00:01<00:01, 1.00 it/s]\x1b[K\n");
  recorder plain;
  {
    accel::progress_bar bar(plain.options());
    bar.write("hello");
  }
  CHECK(plain.text() == "hello\ntrain: 0 elapsed 00:00, ? it/s\n");
}

TEST_CASE("a disabled bar counts, reads no clock and writes nothing", "[progress]") {
  recorder r;
  int clock_reads = 0;
  auto o = r.terminal(10, 80);
  o.enabled = false;
  o.clock = [&] {
    ++clock_reads;
    return r.now;
  };
  {
    accel::progress_bar bar(o);
    bar.update(3);
    bar.set_postfix({{"loss", 0.5}});
    bar.write("not shown");
    bar.close();
    bar.update();
    CHECK(bar.count() == 4);
  }
  std::vector<int> v{1, 2, 3};
  int sum = 0;
  for (int x : accel::progress(v, o)) sum += x;
  CHECK(sum == 6);
  CHECK(r.text().empty());
  CHECK(clock_reads == 0);
}

TEST_CASE("close is idempotent, later updates write nothing, the destructor closes", "[progress]") {
  recorder r;
  auto o = r.options();
  o.total = 3;
  const std::string final_line = "train: 2/3 (66%) elapsed 00:02, remaining 00:01, 1.00 it/s\n";
  SECTION("close twice") {
    accel::progress_bar bar(o);
    r.advance(2s);
    bar.update(2);
    bar.close();
    CHECK(r.text() == final_line);
    bar.close();
    r.advance(1h);
    bar.update();
    CHECK(bar.count() == 3);
  }
  SECTION("destructor") {
    {
      accel::progress_bar bar(o);
      r.advance(2s);
      bar.update(2);
      CHECK(r.text().empty());
    }
  }
  SECTION("a moved-from bar writes nothing; assigning over a bar closes it") {
    accel::progress_bar bar(o);
    r.advance(2s);
    bar.update(2);
    accel::progress_bar moved = std::move(bar);
    bar.close();
    CHECK(r.text().empty());
    moved = accel::progress_bar(accel::progress_options{.description = "", .enabled = false});
    CHECK(r.text() == final_line);
  }
  CHECK(r.text() == final_line);
}

TEST_CASE("progress over a vector: the same elements, by reference, total from its size", "[progress]") {
  recorder r;
  std::vector<int> v{10, 20, 30};
  std::vector<int*> seen;
  {
    auto view = accel::progress(v, r.options("numbers"));
    CHECK(view.size() == 3);
    for (int& x : view) {
      seen.push_back(&x);
      x += 1;
      r.advance(1s);
    }
    CHECK(view.bar().count() == 3);
    CHECK(r.text() == "numbers: 3/3 (100%) elapsed 00:03, remaining 00:00, 1.00 it/s\n");  // closed at the end
  }
  CHECK(seen == std::vector<int*>{&v[0], &v[1], &v[2]});
  CHECK(v == std::vector<int>{11, 21, 31});
  CHECK(r.text() == "numbers: 3/3 (100%) elapsed 00:03, remaining 00:00, 1.00 it/s\n");  // not twice
}

TEST_CASE("progress over pairs with structured bindings, postfix from inside the loop", "[progress]") {
  recorder r;
  std::vector<std::pair<int, std::string>> pairs{{1, "a"}, {2, "b"}};
  auto view = accel::progress(pairs, r.options());
  for (auto&& [number, name] : view) {
    name += "!";
    view.bar().set_postfix({{"last", number}});
  }
  CHECK(pairs == std::vector<std::pair<int, std::string>>{{1, "a!"}, {2, "b!"}});
  CHECK(r.text() == "train: 2/2 (100%) elapsed 00:00, remaining 00:00, ? it/s, last=2\n");
}

TEST_CASE("progress over unsized and move-only input ranges", "[progress]") {
  recorder r;
  SECTION("non-const begin, move-only iterator, referred to") {
    std::vector<int> got;
    countdown three;
    for (int x : accel::progress(three, r.options())) got.push_back(x);
    CHECK(got == std::vector<int>{3, 2, 1});
    CHECK(r.text() == "train: 3 elapsed 00:00, ? it/s\n");
  }
  SECTION("owned") {
    std::vector<int> got;
    for (int x : accel::progress(countdown{4}, r.options())) got.push_back(x);
    CHECK(got == std::vector<int>{4, 3, 2, 1});
    CHECK(r.text() == "train: 4 elapsed 00:00, ? it/s\n");
  }
  SECTION("an explicit total wins over the size") {
    auto o = r.options();
    o.total = 6;
    for (auto x : accel::progress(std::vector<int>{1, 2, 3}, o)) (void)x;
    CHECK(r.text() == "train: 3/6 (50%) elapsed 00:00, remaining ?, ? it/s\n");
  }
}

TEST_CASE("progress over an empty range closes at once, after a break, when the view goes", "[progress]") {
  recorder r;
  SECTION("empty") {
    std::vector<int> none;
    auto view = accel::progress(none, r.options());
    for (int x : view) FAIL(x);
    CHECK(r.text() == "train: 0 elapsed 00:00, ? it/s\n");
  }
  SECTION("break") {
    std::vector<int> v{1, 2, 3, 4, 5};
    {
      auto view = accel::progress(v, r.options());
      for (int x : view) {
        r.advance(1s);
        if (x == 2) break;
      }
      CHECK(r.text().empty());
    }
    CHECK(r.text() == "train: 1/5 (20%) elapsed 00:02, remaining 00:08, 2.00 s/it\n");
  }
}

TEST_CASE("progress over a prepared range", "[progress]") {
  recorder r;
  accel::accelerator<> acc(accel::options{.cpu = true});
  auto batches = acc.prepare(accel_test::regression_batches(3, 2, 4, 1));
  std::int64_t rows = 0;
  for (auto&& [x, y] : accel::progress(batches, r.options())) rows += x.size(0) + y.size(0);
  CHECK(rows == 12);
  CHECK(r.text() == "train: 3/3 (100%) elapsed 00:00, remaining 00:00, ? it/s\n");
  // The accelerator's own: enabled on the local main process (here, the only one) unless the options say not.
  recorder mine;
  for (auto&& [x, y] : acc.progress(batches, mine.options())) rows += x.size(0);
  CHECK(rows == 18);
  CHECK(mine.text() == r.text());
  recorder off;
  auto quiet = off.options();
  quiet.enabled = false;
  for ([[maybe_unused]] auto&& batch : acc.progress(batches, quiet)) {
  }
  CHECK(off.text().empty());
}
