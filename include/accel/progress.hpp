/// \file
/// A progress bar for long loops, what Accelerate users get from tqdm:
///
/// ```cpp
/// for (auto&& [x, y] : accel::progress(batches, {.description = "train"})) { ... }
/// ```
///
/// On a terminal one line is redrawn in place, at most every `redraw_interval`, as wide as the terminal:
/// `train:  40%|#####         | 10/25 [00:10<00:15, 1.00 it/s, loss=0.1, lr=0.0003]`. Elsewhere (a log file, a
/// pipe) a plain line is printed every `line_interval` and once at the end, without '\r' or escape codes:
/// `train: 10/25 (40%) elapsed 00:10, remaining 00:15, 1.00 it/s, loss=0.1, lr=0.0003`. A loop slower than one
/// iteration a second shows seconds per iteration instead (`2.50 s/it`), as tqdm does. A disabled bar (processes
/// other than the local main one) only counts: it reads no clock and writes nothing.
///
/// Plain C++20 and POSIX (isatty, TIOCGWINSZ); no LibTorch. A bar is not thread-safe: update it from one thread.
#pragma once

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include <range/v3/range/access.hpp>
#include <range/v3/range/concepts.hpp>
#include <range/v3/range/primitives.hpp>
#include <range/v3/range/traits.hpp>
#include <vector>

#include "detail/config.hpp"
#include "detail/support/stored.hpp"

namespace accel {

/// The clock a progress bar measures with (monotonic: a bar must not run backwards when the wall clock is set).
using progress_clock = std::chrono::steady_clock;

/// How a progress bar looks and where it goes. A plain aggregate: `{.description = "train", .total = 100}`.
struct progress_options {
  /// Written first, followed by ": " (nothing when empty).
  std::string description;
  /// Iterations expected; `accel::progress` takes the range's size when it has one. Unknown (or 0): the count,
  /// elapsed time and rate only, without bar, percentage or remaining time.
  std::optional<std::size_t> total = std::nullopt;
  /// Where the bar is written.
  std::ostream* output = &std::cerr;
  /// true: one line redrawn in place with '\r' (a terminal); false: plain lines (a log file). Default: whether
  /// `output` is std::cout, std::cerr or std::clog and its file descriptor is a terminal.
  std::optional<bool> redraw = std::nullopt;
  /// Least time between two frames drawn in place: drawing at every iteration would slow a fast loop down.
  std::chrono::milliseconds redraw_interval{100};
  /// Time between two plain lines; one more is printed at the end.
  std::chrono::milliseconds line_interval = std::chrono::seconds(30);
  /// false: the bar counts and does nothing else (Accelerate's `disable=not accelerator.is_local_main_process`).
  bool enabled = true;
  /// Columns of the terminal a frame is fitted to; default: the terminal's width (TIOCGWINSZ), 80 when unknown.
  std::optional<std::size_t> width = std::nullopt;
  /// Where time comes from; tests pass a fake clock.
  std::function<progress_clock::time_point()> clock = [] { return progress_clock::now(); };
};

namespace detail::progress_text {

/// `value` as tqdm's `format_num` writes it: 3 significant digits ("%.3g", exponent without leading zeros),
/// unless the shortest exact form ("%g" with as many digits as it takes, like Python's `str`) is as short.
ACCEL_DECL std::string compact_number(double value);

/// `digits` digits after the point.
ACCEL_DECL std::string fixed(double value, int digits);

/// A duration as tqdm shows it: mm:ss, or h:mm:ss from an hour on.
ACCEL_DECL std::string clock_time(std::chrono::seconds duration);

/// Columns `text` takes on a terminal: one per UTF-8 code point (wide characters are not told apart).
ACCEL_DECL std::size_t columns(std::string_view text);

/// `text` cut to at most `limit` columns, between code points: a frame wider than the terminal would wrap, and
/// '\r' would then redraw only its last row.
ACCEL_DECL std::string fit(std::string text, std::size_t limit);

/// What a frame or a line shows, at one moment.
struct snapshot {
  std::size_t count;
  std::size_t total;  // 0: unknown
  progress_clock::duration elapsed;

  [[nodiscard]] bool has_total() const { return total > 0; }
  [[nodiscard]] std::size_t percent() const { return count * 100 / total; }  // floored: 100% only when done
  [[nodiscard]] double seconds() const { return std::chrono::duration<double>(elapsed).count(); }
  [[nodiscard]] ACCEL_DECL std::string counts() const;
  [[nodiscard]] std::string elapsed_time() const {
    return clock_time(std::chrono::duration_cast<std::chrono::seconds>(elapsed));
  }
  /// At the average rate so far; "?" while there is no rate yet.
  [[nodiscard]] ACCEL_DECL std::string remaining_time() const;
  [[nodiscard]] bool has_rate() const { return count > 0 && seconds() > 0; }
  /// Iterations per second, or seconds per iteration when that is below one (tqdm's `s/it`).
  [[nodiscard]] ACCEL_DECL std::string rate() const;
};

/// A frame (without its '\r') for a terminal `width` columns wide. It fills all but the last column (writing the
/// last one leaves some terminals' cursor waiting to wrap); the bar takes the room the text leaves.
ACCEL_DECL std::string terminal_frame(const snapshot& now, std::string_view prefix, std::string_view postfix,
                                      std::size_t width);

/// One line of a log: no '\r', no escape codes.
ACCEL_DECL std::string plain_line(const snapshot& now, std::string_view prefix, std::string_view postfix);

/// The file descriptor behind the standard streams; -1 for any other stream (a file, a string stream).
ACCEL_DECL int descriptor_of(const std::ostream* stream);

ACCEL_DECL std::size_t terminal_width(int fd);

}  // namespace detail::progress_text

/// A value `set_postfix` shows: a number, written compactly (`0.123`, `3e-4` as `0.0003`, `1.23e+5`; integers
/// exactly), or text as it is. Numbers are formatted only when a frame or line is drawn.
class postfix_value {
 public:
  template <class T>
    requires std::is_arithmetic_v<T>
  postfix_value(T value) {  // NOLINT(google-explicit-constructor): `{{"loss", 0.5}}` should read as it does
    if constexpr (std::is_floating_point_v<T>)
      value_ = static_cast<double>(value);
    else
      value_ = std::to_string(value);
  }
  postfix_value(std::string text) : value_(std::move(text)) {}    // NOLINT(google-explicit-constructor)
  postfix_value(const char* text) : value_(std::string(text)) {}  // NOLINT(google-explicit-constructor)

  [[nodiscard]] ACCEL_DECL std::string text() const;

 private:
  std::variant<double, std::string> value_;
};

namespace detail {

/// What an enabled bar keeps: where it writes, when it last did, the postfix. A disabled bar has none of it.
class progress_display {
 public:
  ACCEL_DECL explicit progress_display(progress_options options);

  ACCEL_DECL void update(std::size_t count);

  /// The last frame (and the newline that keeps it), or the last line unless the latest one showed this count.
  ACCEL_DECL void finish(std::size_t count);

  /// `line` on a line of its own above the bar: the frame is erased, the line written, the frame drawn again.
  ACCEL_DECL void write(std::string_view line, std::size_t count);

  ACCEL_DECL void set_postfix(std::initializer_list<std::pair<std::string_view, postfix_value>> values);

 private:
  [[nodiscard]] progress_clock::duration interval() const {
    return redraw_ ? options_.redraw_interval : options_.line_interval;
  }

  ACCEL_DECL void show(std::size_t count, progress_clock::time_point now);

  /// ", loss=0.123, lr=0.0003": what follows the rate.
  [[nodiscard]] ACCEL_DECL std::string postfix_text() const;

  /// Asked at every frame, so that a resized terminal gets frames of its new width.
  [[nodiscard]] std::size_t width() const { return options_.width.value_or(progress_text::terminal_width(fd_)); }

  progress_options options_;
  int fd_;
  bool redraw_;
  std::string prefix_;
  progress_clock::time_point start_;
  progress_clock::time_point last_shown_at_;
  std::optional<std::size_t> last_shown_count_;
  std::vector<std::pair<std::string, postfix_value>> postfix_;
};

}  // namespace detail

/// A progress bar: `update()` once per iteration, `close()` (or the destructor) at the end. Time is measured from
/// construction. Moving a bar moves its display; the moved-from bar writes nothing more.
class progress_bar {
 public:
  ACCEL_DECL explicit progress_bar(progress_options options = {});
  progress_bar(progress_bar&&) noexcept = default;
  ACCEL_DECL progress_bar& operator=(progress_bar&& other) noexcept;
  /// Closes the bar; a failure to write the last frame is not worth ending the program for.
  ~progress_bar() {
    try {
      close();
    } catch (...) {
    }
  }

  /// `n` more iterations done; draws a frame or line when one is due.
  ACCEL_DECL void update(std::size_t n = 1);

  /// Prints `line` (and a newline) to the bar's output above the bar, which a print to the same terminal would
  /// garble (tqdm's `write`). Like everything else of a disabled bar, it writes nothing: `acc.progress`'s bar is
  /// enabled on the local main process only, where `acc.print` prints too.
  void write(std::string_view line) {
    if (display_) display_->write(line, count_);
  }

  /// Named values shown after the rate from the next frame or line on, replacing the previous ones:
  /// `bar.set_postfix({{"loss", loss.item<double>()}, {"lr", 3e-4}})`.
  void set_postfix(std::initializer_list<std::pair<std::string_view, postfix_value>> values) {
    if (display_) display_->set_postfix(values);
  }

  /// Draws the last frame (then a newline) or line; later calls, and updates, write nothing.
  void close() {
    if (auto display = std::move(display_)) display->finish(count_);
  }

  /// Iterations counted so far (also by a disabled or closed bar).
  [[nodiscard]] std::size_t count() const noexcept { return count_; }

 private:
  std::size_t count_ = 0;
  std::unique_ptr<detail::progress_display> display_;  // null when disabled or closed
};

/// `accel::progress(range, options)`: the elements of `range`, in order and as the range gives them (references
/// stay references), advancing a progress bar at each step. The bar's total is the range's size when it has one;
/// the bar closes when an iterator reaches the end or when the view is destroyed (after a `break`). `Range` is
/// `R&` for an lvalue (referred to) or `R` for an rvalue (owned). Meant for one pass: a second pass counts on,
/// with the bar already closed.
namespace detail {
/// What `progress` iterates: a C++20 input range (move-only iterators included), through std::ranges, or else a
/// range-v3 one (range-v3's views over accel's ranges, say), through range-v3.
template <class R>
concept progress_range = std::ranges::input_range<R> || ranges::input_range<R>;

template <class R>
struct progress_traits {  // std::ranges'
  static decltype(auto) begin(R& r) { return std::ranges::begin(r); }
  static decltype(auto) end(R& r) { return std::ranges::end(r); }
  static constexpr bool sized = std::ranges::sized_range<R>;
  static auto size(R& r) { return std::ranges::size(r); }
  using value_type = std::ranges::range_value_t<R>;
  using difference_type = std::ranges::range_difference_t<R>;
};
template <class R>
  requires(!std::ranges::input_range<R>)
struct progress_traits<R> {  // range-v3's
  static decltype(auto) begin(R& r) { return ranges::begin(r); }
  static decltype(auto) end(R& r) { return ranges::end(r); }
  static constexpr bool sized = ranges::sized_range<R>;
  static auto size(R& r) { return ranges::size(r); }
  using value_type = ranges::range_value_t<R>;
  using difference_type = ranges::range_difference_t<R>;
};
}  // namespace detail

template <detail::progress_range Range>
class progress_view : public std::ranges::view_base {  // a view: `accel::progress(r) | std::views::take(n)` works
  using base_range = std::remove_reference_t<Range>;
  using traits = detail::progress_traits<base_range>;
  using base_iterator = decltype(traits::begin(std::declval<base_range&>()));
  using base_sentinel = decltype(traits::end(std::declval<base_range&>()));

 public:
  class iterator {
   public:
    using value_type = typename traits::value_type;
    using difference_type = typename traits::difference_type;
    using iterator_concept = std::input_iterator_tag;
    using iterator_category = std::input_iterator_tag;  // for std::iterator_traits, which range-v3 reads
    using reference = decltype(*std::declval<const base_iterator&>());
    using pointer = void;

    iterator() = default;  // range-v3's views require it
    iterator(base_iterator current, base_sentinel end, progress_bar& bar)
        : current_(std::move(current)), end_(std::move(end)), bar_(&bar) {
      close_at_end();
    }

    reference operator*() const { return *current_; }
    iterator& operator++() {
      ++current_;
      bar_->update();
      close_at_end();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) { return it.current_ == it.end_; }

   private:
    void close_at_end() {
      if (current_ == end_) bar_->close();
    }

    base_iterator current_;
    base_sentinel end_;
    progress_bar* bar_ = nullptr;
  };

  progress_view(Range&& range, progress_options options)
      : range_(std::forward<Range>(range)), bar_(with_total(range_.get(), std::move(options))) {}

  iterator begin() {
    auto& range = range_.get();
    return iterator(traits::begin(range), traits::end(range), bar_);
  }
  static std::default_sentinel_t end() noexcept { return {}; }
  auto size()
    requires traits::sized
  {
    return traits::size(range_.get());
  }

  /// The bar, for `set_postfix` inside the loop.
  progress_bar& bar() noexcept { return bar_; }

 private:
  static progress_options with_total(base_range& range, progress_options options) {
    if constexpr (traits::sized)
      if (!options.total) options.total = static_cast<std::size_t>(traits::size(range));
    return options;
  }

  detail::stored<Range> range_;
  progress_bar bar_;
};

/// `for (auto&& batch : accel::progress(batches, {.description = "train"}))`: see `progress_view`.
template <detail::progress_range Range>
[[nodiscard]] progress_view<Range> progress(Range&& range, progress_options options = {}) {
  return progress_view<Range>(std::forward<Range>(range), std::move(options));
}

namespace detail {
/// `accelerator::progress`'s way to `accel::progress`, named where this header is included.
struct progress_bars {
  template <class Range>
  static auto over(Range&& range, progress_options options) {
    return accel::progress(std::forward<Range>(range), std::move(options));
  }
};
}  // namespace detail

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/progress.ipp"
#endif
