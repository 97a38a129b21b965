/// \file
/// Sharding a range of batches between processes exactly as Accelerate's `BatchSamplerShard` does:
/// `batches | accel::views::shard(options)` yields, lazily, the batches process `options.process_index` of
/// `options.num_processes` gets. With one process, the batches as they are.
///
/// - Whole batches, round robin: process r takes batches r, r + P, ...; a round is released once it is complete.
/// - `even_batches` (default): the last, incomplete round is completed by looping back to the first samples, so
///   every process gets the same number of full batches (also when the data holds less than one global batch).
///   Without it, leftovers stay with their owners.
/// - `split_batches`: every batch is cut into P slices of `batch_size / P` instead (a short last batch is
///   completed from the first batch under `even_batches`).
/// - `drop_last`: the incomplete last round (or short last batch) is dropped.
/// A batch is a `std::vector` of samples (indices), a tensor (samples along dim 0), or a pair, tuple or
/// `torch::data::Example` of those. Only the first P batches are kept, to loop back to.
#pragma once

#include <ATen/ATen.h>
#include <torch/data/example.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <ranges>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/config.hpp"
#include "detail/data/batch_channel.hpp"
#include "detail/support/stored.hpp"
#include "batch_range.hpp"

namespace accel {

/// How a range of batches is divided between processes (Accelerate's `BatchSamplerShard` arguments).
struct shard_options {
  /// Samples per batch of the input; empty when batches vary in size (then padding repeats whole batches from
  /// the start, and `split_batches` is refused).
  std::optional<std::int64_t> batch_size = std::nullopt;
  bool drop_last = false;
  int num_processes = 1;
  int process_index = 0;
  bool split_batches = false;
  bool even_batches = true;
};

namespace detail {

/// How to count, cut and join the samples of a batch, along its first dimension.
template <class Batch>
struct batch_slicing;

template <class T>
struct batch_slicing<std::vector<T>> {
  static std::int64_t size(const std::vector<T>& b) { return static_cast<std::int64_t>(b.size()); }
  static std::vector<T> slice(const std::vector<T>& b, std::int64_t start, std::int64_t stop) {
    return std::vector<T>(b.begin() + start, b.begin() + stop);
  }
  static std::vector<T> concat(std::vector<T> a, const std::vector<T>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
};

template <>
struct batch_slicing<at::Tensor> {
  static std::int64_t size(const at::Tensor& b) { return b.size(0); }
  static at::Tensor slice(const at::Tensor& b, std::int64_t start, std::int64_t stop) {
    return b.narrow(0, start, stop - start);
  }
  static at::Tensor concat(const at::Tensor& a, const at::Tensor& b) { return at::cat({a, b}); }
};

template <class... Ts>
struct batch_slicing<std::tuple<Ts...>> {
  using batch = std::tuple<Ts...>;
  static std::int64_t size(const batch& b) {
    return batch_slicing<std::tuple_element_t<0, batch>>::size(std::get<0>(b));
  }
  static batch slice(const batch& b, std::int64_t start, std::int64_t stop) {
    return std::apply([&](const auto&... x) { return batch{batch_slicing<Ts>::slice(x, start, stop)...}; }, b);
  }
  static batch concat(const batch& a, const batch& b) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return batch{batch_slicing<Ts>::concat(std::get<I>(a), std::get<I>(b))...};
    }(std::index_sequence_for<Ts...>{});
  }
};

template <class A, class B>
struct batch_slicing<std::pair<A, B>> {
  using batch = std::pair<A, B>;
  static std::int64_t size(const batch& b) { return batch_slicing<A>::size(b.first); }
  static batch slice(const batch& b, std::int64_t start, std::int64_t stop) {
    return {batch_slicing<A>::slice(b.first, start, stop), batch_slicing<B>::slice(b.second, start, stop)};
  }
  static batch concat(const batch& a, const batch& b) {
    return {batch_slicing<A>::concat(a.first, b.first), batch_slicing<B>::concat(a.second, b.second)};
  }
};

template <class Data, class Target>
struct batch_slicing<torch::data::Example<Data, Target>> {
  using batch = torch::data::Example<Data, Target>;
  static std::int64_t size(const batch& b) { return batch_slicing<Data>::size(b.data); }
  static batch slice(const batch& b, std::int64_t start, std::int64_t stop) {
    return {batch_slicing<Data>::slice(b.data, start, stop), batch_slicing<Target>::slice(b.target, start, stop)};
  }
  static batch concat(const batch& a, const batch& b) {
    return {batch_slicing<Data>::concat(a.data, b.data), batch_slicing<Target>::concat(a.target, b.target)};
  }
};

/// `size_from_first_batch`: the batch size is not known yet (`prepare` takes the first batch's).
ACCEL_DECL void validate(const shard_options& o, bool size_from_first_batch = false);

}  // namespace detail

/// A batch `views::shard` can cut and join.
template <class B>
concept shardable_batch = requires(const B& b) {
  { detail::batch_slicing<B>::size(b) } -> std::convertible_to<std::int64_t>;
  { detail::batch_slicing<B>::slice(b, 0, 1) } -> std::convertible_to<B>;
  { detail::batch_slicing<B>::concat(b, b) } -> std::convertible_to<B>;
};

namespace detail {
/// What `views::shard` holds a batch of the input as: the batch itself, or, for another range of samples (a
/// chunk of range-v3's `views::chunk` or of `std::views::chunk`, say), the `std::vector` of its samples.
template <class B>
struct shard_batch {
  using type = B;
};
template <class B>
  requires(!shardable_batch<B> && std::ranges::input_range<B>)
struct shard_batch<B> {
  using type = std::vector<std::ranges::range_value_t<B>>;
};
template <class B>
using shard_batch_t = typename shard_batch<std::remove_cvref_t<B>>::type;

template <class B>
decltype(auto) as_shard_batch(B&& batch) {
  if constexpr (std::is_same_v<shard_batch_t<B>, std::remove_cvref_t<B>>)
    return std::forward<B>(batch);
  else {
    shard_batch_t<B> samples;
    if constexpr (std::ranges::sized_range<B>) samples.reserve(std::ranges::size(batch));
    for (auto&& sample : batch) samples.push_back(std::forward<decltype(sample)>(sample));
    return samples;
  }
}
}  // namespace detail

namespace detail {
/// Accelerate's DataLoaderDispatcher: process 0 reads the input a global batch at a time (P batches of the input
/// concatenated, or one with split_batches) and sends it to every process, which keeps its slice (the global
/// batch's size / P samples). A last global batch that does not divide by P is completed with the first P samples
/// of the first one, one more sample each (unless drop_last); a last round of fewer than P batches is sent as it is
/// (so the last batches may be smaller than the others, as Accelerate's), or dropped with drop_last.
template <class Batch>
class dispatch_rounds {
  using slicing = batch_slicing<Batch>;

 public:
  dispatch_rounds(std::shared_ptr<batch_channel<Batch>> channel, const shard_options& options)
      : channel_(std::move(channel)), options_(options) {}

  /// This process's next batch (nullopt at the end). `pull()` gives process 0's next batch of the input (nullopt
  /// at its end); only process 0 calls it. A collective: every process calls `next` as often.
  template <class Pull>
  std::optional<Batch> next(Pull& pull) {
    if (!started_) {
      ahead_ = fetch(pull);
      started_ = true;
    }
    if (!ahead_) return std::nullopt;
    Batch global = std::move(*ahead_);
    ahead_ = fetch(pull);  // a round ahead: the last global batch is known as such
    const auto P = options_.num_processes;
    const auto observed = slicing::size(global);
    if (!options_.drop_last && !first_) first_ = slicing::slice(global, 0, std::min<std::int64_t>(P, observed));
    auto each = observed / P;
    if (!ahead_) {
      remainder_ = observed;
      if (!options_.drop_last && observed % P != 0) {
        global = slicing::concat(global, *first_);
        ++each;
      }
    }
    const auto start = std::min(each * options_.process_index, slicing::size(global));
    return slicing::slice(global, start, std::min(start + each, slicing::size(global)));
  }
  /// The samples of the last global batch, once it has been reached; -1 before.
  [[nodiscard]] std::int64_t remainder() const noexcept { return remainder_; }

 private:
  template <class Pull>
  std::optional<Batch> fetch(Pull& pull) {
    std::optional<Batch> global;
    if (options_.process_index == 0 && !input_ended_) {
      const int wanted = options_.split_batches ? 1 : options_.num_processes;
      for (int k = 0; k < wanted; ++k) {
        auto batch = pull();
        if (!batch) {
          input_ended_ = true;
          break;
        }
        global = global ? slicing::concat(*global, *batch) : std::move(*batch);
      }
      const bool short_round = input_ended_ && !options_.split_batches;
      const bool short_batch =
          options_.split_batches && global && options_.batch_size && slicing::size(*global) < *options_.batch_size;
      if (options_.drop_last && (short_round || short_batch)) global.reset();
    }
    return channel_->from_main(std::move(global));
  }

  std::shared_ptr<batch_channel<Batch>> channel_;
  shard_options options_;
  bool started_ = false;
  bool input_ended_ = false;
  std::optional<Batch> ahead_;
  std::optional<Batch> first_;  // the first P samples, to complete the last global batch
  std::int64_t remainder_ = -1;
};
}  // namespace detail

/// The batches one process gets from `Range` (see the file comment). An input range; iterating it again starts
/// a new pass over `Range`.
template <class Range>
  requires batch_range<Range>
class shard_view {
  using base_range = std::remove_reference_t<Range>;
  using base_iterator = decltype(detail::adl::range_begin(std::declval<base_range&>()));
  using base_sentinel = decltype(detail::adl::range_end(std::declval<base_range&>()));

 public:
  using batch_type = detail::shard_batch_t<decltype(*std::declval<base_iterator&>())>;
  static_assert(shardable_batch<batch_type>,
                "accel::views::shard takes batches that are a std::vector of samples (or any other range of "
                "samples), an at::Tensor (samples along dim 0), or a std::pair / std::tuple / torch::data::Example "
                "of those");
  using slicing = detail::batch_slicing<batch_type>;

  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;
    using iterator_category = std::input_iterator_tag;  // for std::iterator_traits, which range-v3 reads
    using reference = batch_type&;
    using pointer = void;

    /// Default-constructible and copyable (a copy carries the batches it holds): what range-v3's views require.
    iterator() = default;
    iterator(base_iterator base, base_sentinel end, const shard_view& view, std::size_t skip = 0)
        : base_(std::move(base)), end_(std::move(end)), options_(view.options_), view_(&view) {
      if (view.channel_) rounds_ = std::make_shared<detail::dispatch_rounds<batch_type>>(view.channel_, options_);
      if (!rounds_ || r() == 0)                             // dispatching, only process 0 reads the input
        for (; skip > 0 && base_ != end_; --skip) ++base_;  // resumed under another number of processes
      fill();
    }
    batch_type& operator*() const noexcept { return out_.front(); }
    iterator& operator++() {
      out_.pop_front();
      fill();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept { return it.out_.empty(); }

   private:
    const shard_options& o() const { return options_; }
    [[nodiscard]] int P() const { return o().num_processes; }
    [[nodiscard]] int r() const { return o().process_index; }

    /// Pulls batches until one is ready for this process, or the input ends (then works out the tail).
    void fill() {
      if (rounds_) return dispatch();
      while (out_.empty() && !finished_) {
        if (base_ != end_) {
          take(detail::as_shard_batch(*base_));
          ++base_;
        } else {
          finished_ = true;
          view_->samples_ = samples_;
          if (P() > 1) o().split_batches ? split_tail() : whole_tail();
        }
      }
    }

    /// Dispatching: process 0 reads, every process keeps its slice of what it sends.
    void dispatch() {
      if (finished_) return;
      auto pull = [this]() -> std::optional<batch_type> {
        if (!(base_ != end_)) return std::nullopt;  // batch_range promises `!=` only
        batch_type batch = detail::as_shard_batch(*base_);
        ++base_;
        return batch;
      };
      if (auto mine = rounds_->next(pull)) {
        out_.push_back(std::move(*mine));
      } else {
        finished_ = true;
      }
      view_->dispatched_remainder_ = rounds_->remainder();
    }

    void take(const batch_type& batch) {
      if (P() == 1) return out_.push_back(batch);  // one process: the batches as they are, nothing padded
      ++idx_;
      if (idx_ == 0 && !options_.batch_size && view_->infer_batch_size_) {  // the first batch sets the size
        options_.batch_size = slicing::size(batch);
        if (options_.split_batches && *options_.batch_size % P() != 0)
          throw std::invalid_argument("accel: split_batches cuts every batch into " + std::to_string(P()) +
                                      " equal parts, but the first batch, whose size is taken as the batch size, has " +
                                      std::to_string(*options_.batch_size) +
                                      " samples; choose a batch size that is a multiple of the number of processes");
      }
      check_size(batch);
      if (idx_ == 0) view_->batch_size_ = options_.batch_size;
      samples_ += slicing::size(batch);
      o().split_batches ? take_split(batch) : take_whole(batch);
      last_ = batch;
    }

    // Whole batches, round robin (BatchSamplerShard._iter_with_no_split).
    void take_whole(const batch_type& batch) {
      if (!o().drop_last && idx_ < P()) remember(batch);
      if (idx_ % P() == r()) to_yield_ = batch;
      const bool full = !o().batch_size || slicing::size(batch) == *o().batch_size;
      if (idx_ % P() == P() - 1 && full) {
        if (to_yield_) out_.push_back(std::move(*to_yield_));
        to_yield_.reset();
      }
    }
    void whole_tail() {
      if (o().drop_last || idx_ < 0) return;
      if (!o().even_batches) {
        if (to_yield_) out_.push_back(std::move(*to_yield_));
        return;
      }
      if (!o().batch_size) return varying_size_tail();
      const auto B = *o().batch_size;
      if (to_yield_ && slicing::size(*to_yield_) == B) out_.push_back(std::move(*to_yield_));
      while (slicing::size(*initial_) < P() * B) initial_ = slicing::concat(*initial_, *initial_);
      std::optional<batch_type> batch = last_;
      auto idx = idx_;
      if (slicing::size(*last_) == B) {  // its owner has it already
        batch.reset();
        ++idx;
      }
      std::int64_t cycle = 0;
      while (idx % P() != 0 || batch) {
        const auto have = batch ? slicing::size(*batch) : 0;
        auto filler = slicing::slice(*initial_, cycle, cycle + B - have);
        auto completed = batch ? slicing::concat(*batch, filler) : filler;
        if (idx % P() == r()) out_.push_back(std::move(completed));
        cycle += B - have;
        batch.reset();
        ++idx;
      }
    }
    /// Batches of varying size: the last round is completed with whole batches from the start.
    void varying_size_tail() {
      if (to_yield_) out_.push_back(std::move(*to_yield_));
      auto idx = idx_ + 1;
      for (std::size_t k = 0; idx % P() != 0; ++k, ++idx)
        if (idx % P() == r()) out_.push_back(first_batches_[k % first_batches_.size()]);
    }

    // Each batch cut into P slices (BatchSamplerShard._iter_with_split).
    void take_split(const batch_type& batch) {
      if (idx_ == 0) initial_ = batch;
      if (slicing::size(batch) == *o().batch_size) out_.push_back(my_slice(batch));
    }
    void split_tail() {
      if (o().drop_last || idx_ < 0 || slicing::size(*last_) >= *o().batch_size) return;
      if (!o().even_batches) {
        if (slicing::size(*last_) > slice_length() * r()) out_.push_back(my_slice(*last_));
        return;
      }
      while (slicing::size(*initial_) < *o().batch_size) initial_ = slicing::concat(*initial_, *initial_);
      out_.push_back(my_slice(slicing::concat(*last_, *initial_)));
    }
    [[nodiscard]] std::int64_t slice_length() const { return *o().batch_size / P(); }
    batch_type my_slice(const batch_type& batch) const {
      const auto start = std::min(slice_length() * r(), slicing::size(batch));
      const auto stop = std::min(slice_length() * (r() + 1), slicing::size(batch));
      return slicing::slice(batch, start, stop);
    }

    /// With a batch size, only the last batch may be short, and none longer: else rounds would be lost silently.
    void check_size(const batch_type& batch) {
      if (!options_.batch_size) return;
      const auto size = slicing::size(batch);
      if (short_seen_ || size > *options_.batch_size || size == 0)
        throw std::invalid_argument(
            "accel::views::shard: batch " + std::to_string(short_seen_ ? idx_ - 1 : idx_) + " has " +
            std::to_string(short_seen_ ? short_size_ : size) + " samples where " +
            std::to_string(*options_.batch_size) +
            " are expected; with a batch size only the last batch may be short (for batches of varying size, "
            "leave shard_options::batch_size empty)");
      if (size < *options_.batch_size) {
        short_seen_ = true;
        short_size_ = size;
      }
    }

    void remember(const batch_type& batch) {
      if (o().batch_size)
        initial_ = initial_ ? slicing::concat(*initial_, batch) : batch;
      else
        first_batches_.push_back(batch);
    }

    base_iterator base_;
    base_sentinel end_;
    shard_options options_;
    const shard_view* view_ = nullptr;
    std::int64_t idx_ = -1;
    std::int64_t samples_ = 0;
    bool short_seen_ = false;
    std::int64_t short_size_ = 0;
    bool finished_ = false;
    std::optional<batch_type> initial_;      // the first P batches' samples, to loop back to
    std::vector<batch_type> first_batches_;  // the same for batches of varying size
    std::optional<batch_type> to_yield_;
    std::optional<batch_type> last_;
    mutable std::deque<batch_type> out_;
    std::shared_ptr<detail::dispatch_rounds<batch_type>> rounds_;  // dispatching (shared by copies of the iterator)
  };

  shard_view(Range&& range, const shard_options& options) : range_(std::forward<Range>(range)), options_(options) {
    detail::validate(options_);
  }
  /// Without `options.batch_size`, takes the size of the first batch as the batch size (what `prepare` does for
  /// a range that does not say), instead of treating batches as varying in size.
  struct infer_batch_size_t {};
  shard_view(Range&& range, const shard_options& options, infer_batch_size_t)
      : range_(std::forward<Range>(range)), options_(options), infer_batch_size_(true) {
    detail::validate(options_, /*size_from_first_batch=*/true);
  }

  /// Dispatching (Accelerate's DataLoaderDispatcher, `options::dispatch_batches`): only process 0 reads the
  /// input and `channel` carries each global batch to every process, which keeps its slice (see `dispatch_rounds`).
  void dispatch_from_main(std::shared_ptr<detail::batch_channel<batch_type>> channel) { channel_ = std::move(channel); }
  [[nodiscard]] bool dispatching() const noexcept { return channel_ != nullptr; }

  [[nodiscard]] iterator begin() const {
    samples_ = -1;
    dispatched_remainder_ = -1;
    auto& range = range_.get();
    return iterator(detail::adl::range_begin(range), detail::adl::range_end(range), *this,
                    std::exchange(skip_input_, 0));
  }
  /// The next pass shares out the input from its `n`-th batch on (the first `n` are passed over, not shared):
  /// resuming a pass begun under another number of processes. Later passes are whole.
  void skip_input_batches(std::size_t n) const noexcept { skip_input_ = n; }
  [[nodiscard]] static constexpr std::default_sentinel_t end() noexcept { return {}; }

  /// This process's number of batches, when the input knows its own (Accelerate's `BatchSamplerShard.__len__`).
  /// With split_batches it is an upper bound, as Accelerate's, when the input ends in a short batch that is dropped
  /// (drop_last) or leaves the last processes no slice (without even_batches).
  [[nodiscard]] std::size_t size() const
    requires requires(const base_range& r) { detail::adl::range_size(r); }
  {
    const auto n = static_cast<std::size_t>(detail::adl::range_size(std::as_const(range_.get())));
    const auto P = static_cast<std::size_t>(options_.num_processes);
    if (options_.split_batches || P == 1) return n;
    if (channel_) return options_.drop_last ? n / P : (n + P - 1) / P;  // a global batch of P batches per step
    if (n % P == 0 || options_.drop_last) return n / P;
    if (options_.even_batches) return n / P + 1;
    return n / P + (static_cast<std::size_t>(options_.process_index) < n % P ? 1 : 0);
  }

  [[nodiscard]] const shard_options& options() const noexcept { return options_; }
  /// From the next pass on, the last round is completed (true) or left uneven (`join_uneven_inputs`).
  void set_even_batches(bool even) noexcept { options_.even_batches = even; }
  /// Samples in the whole input (every process's; after the batches `skip_input_batches` passed over), once a pass
  /// has read all of it; -1 before.
  [[nodiscard]] std::int64_t input_samples() const noexcept { return samples_; }
  /// Samples of the last global batch that are real (Accelerate's `remainder`, what `gather_for_metrics` keeps on
  /// the last batch); -1 when nothing is padded (drop_last) or the input has not been read to its end.
  [[nodiscard]] std::int64_t remainder() const noexcept {
    if (channel_) return options_.drop_last ? -1 : dispatched_remainder_;  // the last global batch's samples
    if (samples_ < 0 || options_.drop_last || !batch_size_ || options_.num_processes == 1) return -1;
    const auto global = options_.split_batches ? *batch_size_ : *batch_size_ * options_.num_processes;
    return samples_ % global;
  }

 private:
  mutable detail::stored<Range> range_;
  shard_options options_;
  bool infer_batch_size_ = false;
  mutable std::int64_t samples_ = -1;
  mutable std::optional<std::int64_t> batch_size_;
  mutable std::size_t skip_input_ = 0;
  std::shared_ptr<detail::batch_channel<batch_type>> channel_;
  mutable std::int64_t dispatched_remainder_ = -1;
};

namespace detail {

/// Batches of the input that make one batch of each process: P whole batches shared round robin, or one batch
/// split in P (and one batch as it is for one process). What converts a data position between numbers of processes.
inline std::int64_t input_batches_per_batch(const shard_options& o) noexcept {
  return o.split_batches ? 1 : o.num_processes;
}

/// Accelerate's `split_between_processes`: contiguous parts, the first `size % P` one element longer; with
/// padding, every part as long as the longest, completed with the input's last element (5 items on 4 processes:
/// [0, 1], [2, 4], [3, 4], [4, 4]).
ACCEL_DECL std::pair<std::int64_t, std::int64_t> part_bounds(std::int64_t size, int process, int processes);

template <class T>
std::vector<T> split_between_processes(const std::vector<T>& data, int process, int processes, bool pad) {
  const auto [start, stop] = part_bounds(static_cast<std::int64_t>(data.size()), process, processes);
  std::vector<T> part(data.begin() + start, data.begin() + stop);
  const auto longest = (static_cast<std::int64_t>(data.size()) + processes - 1) / processes;
  if (pad && !data.empty())
    part.resize(static_cast<std::size_t>(std::max<std::int64_t>(longest, static_cast<std::int64_t>(part.size()))),
                data.back());
  return part;
}

ACCEL_DECL at::Tensor split_between_processes(const at::Tensor& data, int process, int processes, bool pad);

/// A map: each value is split (Accelerate splits a dict's values).
template <class K, class V>
std::map<K, V> split_between_processes(const std::map<K, V>& data, int process, int processes, bool pad) {
  std::map<K, V> part;
  for (const auto& [key, value] : data) part.emplace(key, split_between_processes(value, process, processes, pad));
  return part;
}

}  // namespace detail

namespace views {
/// The closure of `views::shard(options)`: `range | views::shard(options)`.
struct shard_closure {
  shard_options options;
  template <class Range>
    requires batch_range<Range>
  friend auto operator|(Range&& range, const shard_closure& closure) {
    return shard_view<Range>(std::forward<Range>(range), closure.options);
  }
};
/// `batches | accel::views::shard(options)`: this process's batches (see accel/shard.hpp).
ACCEL_DECL shard_closure shard(const shard_options& options);
}  // namespace views

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/shard.ipp"
#endif
