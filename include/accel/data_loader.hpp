/// \file
/// Sample-level loading: `accel::data_loader(dataset, {.batch_size = 32, .shuffle = true, .seed = 7})` is a range
/// of collated batches over a LibTorch dataset (`get(index)` and `size()`) or any random-access range of samples.
/// Shuffling depends only on (seed, epoch), so every process draws the same permutation, and each pass is a new
/// epoch (or the one `set_epoch` chose), as Accelerate's seedable sampler. Prepared under `data_parallel`, the
/// index batches are sharded before any sample is loaded, so each process reads only its own samples.
#pragma once

#include <ATen/ATen.h>
#include <torch/data/example.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <iterator>
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
#include "detail/support/stored.hpp"
#include "detail/support/tensor_structure.hpp"
#include "detail/support/text.hpp"
#include "detail/data/worker_threads.hpp"
#include "shard.hpp"

namespace accel {

struct loader_options {
  std::int64_t batch_size = 1;
  bool shuffle = false;
  /// With `shuffle`: the permutation of epoch e is a function of (seed, e) alone.
  std::uint64_t seed = 0;
  bool drop_last = false;
  /// Threads that load and collate batches ahead of the loop (PyTorch's `num_workers`, as threads: the dataset's
  /// `get` is then called from several threads at once). 0: each batch is loaded in the loop, when first used.
  /// Batches come out in the same order, with the same contents, whatever the number.
  int num_workers = 0;
  /// Batches loaded ahead per worker: at most `num_workers * prefetch_factor` beyond the one in use.
  int prefetch_factor = 2;
  /// Collated tensors are placed in page-locked memory (with CUDA; without, nothing to do), so that copying them
  /// to the GPU does not block (see `options::non_blocking`). Tensors, their structures and Examples.
  bool pin_memory = false;
  /// The workers live as long as the loader, instead of starting with each pass and stopping at its end.
  bool persistent_workers = false;
};

namespace detail {

/// Stacks samples into a batch: tensors along a new dim 0, pairs/tuples/Examples element by element; anything
/// else is returned as a vector of samples.
template <class Sample>
struct collation {
  static std::vector<Sample> collate(std::vector<Sample> samples) { return samples; }
};
template <>
struct collation<at::Tensor> {
  static at::Tensor collate(const std::vector<at::Tensor>& samples) { return at::stack(samples); }
};
template <class Data, class Target>
struct collation<torch::data::Example<Data, Target>> {
  static auto collate(const std::vector<torch::data::Example<Data, Target>>& samples) {
    std::vector<Data> data;
    std::vector<Target> targets;
    for (const auto& s : samples) {
      data.push_back(s.data);
      targets.push_back(s.target);
    }
    return torch::data::Example<decltype(collation<Data>::collate(data)),
                                decltype(collation<Target>::collate(targets))>{collation<Data>::collate(data),
                                                                               collation<Target>::collate(targets)};
  }
};
/// The std::pair or std::tuple that a sample is or derives from (range-v3's zip samples, `common_pair` and
/// `common_tuple`, derive from them): declared only, to name the element types in unevaluated contexts.
template <class A, class B>
std::pair<A, B> pair_base(const std::pair<A, B>&);
template <class... Ts>
std::tuple<Ts...> tuple_base(const std::tuple<Ts...>&);
template <class S>
concept pair_sample = requires(const S& s) { detail::pair_base(s); };
template <class S>
concept tuple_sample = requires(const S& s) { detail::tuple_base(s); };

/// Element I of every sample, seen as its std::pair or std::tuple `Base`, collated; references (range-v3's zip of
/// references) are collated as the values they refer to.
template <std::size_t I, class Base, class S>
auto collate_column(const std::vector<S>& samples) {
  using element = std::remove_cvref_t<std::tuple_element_t<I, Base>>;
  std::vector<element> column;
  column.reserve(samples.size());
  for (const auto& s : samples) column.push_back(std::get<I>(static_cast<const Base&>(s)));
  return collation<element>::collate(column);
}
/// Pair samples collated as a std::pair of the collated firsts and seconds.
template <pair_sample S>
struct collation<S> {
  using base = decltype(detail::pair_base(std::declval<const S&>()));
  static auto collate(const std::vector<S>& samples) {
    return std::pair{collate_column<0, base>(samples), collate_column<1, base>(samples)};
  }
};
/// Tuple samples collated as a std::tuple of the collated elements, element by element.
template <tuple_sample S>
struct collation<S> {
  using base = decltype(detail::tuple_base(std::declval<const S&>()));
  static auto collate(const std::vector<S>& samples) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple{collate_column<I, base>(samples)...};
    }(std::make_index_sequence<std::tuple_size_v<base>>{});
  }
};

/// A LibTorch dataset: `get(index)` and `size()` (an optional size, as `torch::data::datasets::Dataset` has).
template <class D>
concept indexed_dataset = requires(D& d, std::size_t i) {
  d.get(i);
  d.size();
};

template <class D>
std::int64_t dataset_size(D& d) {
  if constexpr (indexed_dataset<D>) {
    auto n = d.size();
    if constexpr (requires { n.has_value(); }) {
      if (!n.has_value())
        throw std::invalid_argument(
            "accel::data_loader: the dataset does not know its size (an iterable dataset); "
            "give it a size, or batch it yourself and prepare the range of batches");
      return static_cast<std::int64_t>(*n);
    } else {
      return static_cast<std::int64_t>(n);
    }
  } else {
    return static_cast<std::int64_t>(std::ranges::size(d));
  }
}

template <class D>
decltype(auto) dataset_get(D& d, std::int64_t i) {
  if constexpr (indexed_dataset<D>)
    return d.get(static_cast<std::size_t>(i));
  else
    return std::ranges::begin(d)[i];
}

/// A collated batch in page-locked memory, where CUDA is there to use it; other batch types as they are.
template <class Batch>
Batch pinned_batch(Batch batch) {
  if (!at::hasCUDA()) return batch;
  auto pin = [](const at::Tensor& t) { return t.is_pinned() ? t : t.pin_memory(); };
  if constexpr (is_tensor_structure<Batch>) {
    return map_tensors(batch, pin);
  } else if constexpr (requires {
                         batch.data;
                         batch.target;
                       }) {
    if constexpr (is_tensor_structure<decltype(batch.data)>) batch.data = map_tensors(batch.data, pin);
    if constexpr (is_tensor_structure<decltype(batch.target)>) batch.target = map_tensors(batch.target, pin);
    return batch;
  } else {
    return batch;
  }
}

/// What failed, for a message that wraps it.
ACCEL_DECL std::string failure_text(const std::exception_ptr& failure);

}  // namespace detail

/// A range of batches loaded sample by sample from `Dataset` (`D&` for an lvalue, referred to; `D` for an rvalue,
/// owned). Iterating it is one pass (an epoch).
template <class Dataset>
class data_loader {
  using dataset_type = std::remove_reference_t<Dataset>;

 public:
  using sample_type = std::remove_cvref_t<decltype(detail::dataset_get(std::declval<dataset_type&>(), 0))>;
  using batch_type = decltype(detail::collation<sample_type>::collate(std::declval<std::vector<sample_type>>()));

  data_loader(Dataset&& dataset, const loader_options& options)
      : dataset_(std::forward<Dataset>(dataset)), options_(options), size_(detail::dataset_size(dataset_.get())) {
    if (options_.batch_size < 1)
      throw std::invalid_argument("accel::data_loader: batch_size = " + std::to_string(options_.batch_size) +
                                  " must be at least 1");
    if (size_ == 0) throw std::invalid_argument("accel::data_loader: the dataset is empty; there is nothing to load");
    if (options_.num_workers < 0)
      throw std::invalid_argument("accel::data_loader: num_workers = " + std::to_string(options_.num_workers) +
                                  " must be 0 (load in the loop) or more");
    if (options_.num_workers > 0 && options_.prefetch_factor < 1)
      throw std::invalid_argument("accel::data_loader: prefetch_factor = " + std::to_string(options_.prefetch_factor) +
                                  " must be at least 1: each worker loads that many batches ahead");
    if (options_.persistent_workers && options_.num_workers == 0)
      throw std::invalid_argument(
          "accel::data_loader: persistent_workers needs num_workers > 0 (there are no workers to keep)");
  }

  /// The index batches of `epoch`, in order (a permutation of 0..size-1 when shuffling).
  [[nodiscard]] std::vector<std::vector<std::int64_t>> index_batches(std::int64_t epoch) const {
    std::vector<std::int64_t> order(static_cast<std::size_t>(size_));
    if (options_.shuffle) {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<std::uint64_t>(epoch));
      auto permutation = at::randperm(size_, generator, at::TensorOptions().dtype(at::kLong));
      std::copy_n(permutation.data_ptr<std::int64_t>(), size_, order.begin());
    } else {
      for (std::int64_t i = 0; i < size_; ++i) order[static_cast<std::size_t>(i)] = i;
    }
    std::vector<std::vector<std::int64_t>> batches;
    for (std::int64_t start = 0; start < size_; start += options_.batch_size) {
      const auto stop = std::min(start + options_.batch_size, size_);
      if (stop - start < options_.batch_size && options_.drop_last) break;
      batches.emplace_back(order.begin() + start, order.begin() + stop);
    }
    return batches;
  }

  /// The samples at `indices`, collated (and pinned, with `pin_memory`). A failure names the sample (or the
  /// batch) and keeps the dataset's exception nested (`std::rethrow_if_nested`).
  [[nodiscard]] batch_type load(const std::vector<std::int64_t>& indices) const {
    std::vector<sample_type> samples;
    samples.reserve(indices.size());
    for (auto i : indices) samples.push_back(load_sample(i));
    try {
      auto batch = detail::collation<sample_type>::collate(std::move(samples));
      if (options_.pin_memory) return detail::pinned_batch(std::move(batch));
      return batch;
    } catch (...) {
      std::throw_with_nested(std::runtime_error("accel::data_loader: collating the batch of samples " +
                                                std::to_string(indices.front()) +
                                                ", ... failed: " + detail::failure_text(std::current_exception())));
    }
  }

  /// One pass: iterates `batches` (index batches of one epoch, sharded or not), loading each. Its iterator
  /// shares ownership of it, so that a new pass (a nested loop, a peek at `*begin()`) never pulls the rug from
  /// under one in progress. Batches are loaded when first used, and no earlier: skipped ones are never read. With
  /// workers, using one starts loading the next `num_workers * prefetch_factor` on them; they are taken in order.
  template <class IndexBatches>
  class pass {
   public:
    pass(const data_loader& loader, IndexBatches batches)
        : loader_(&loader), batches_(std::move(batches)), next_(batches_.begin()), workers_(loader.workers()) {}
    pass(const pass&) = delete;
    pass& operator=(const pass&) = delete;
    /// Loads of this pass still queued on persistent workers are dropped; a pass's own workers stop and join.
    ~pass() { abandoned_->store(true); }

    class iterator {
     public:
      using value_type = batch_type;
      using difference_type = std::ptrdiff_t;
      using iterator_concept = std::input_iterator_tag;
      using iterator_category = std::input_iterator_tag;  // for std::iterator_traits, which range-v3 reads
      using reference = batch_type&;
      using pointer = void;
      iterator() = default;  // with copies sharing the pass's position: range-v3 asks both of an input iterator
      explicit iterator(std::shared_ptr<pass> owner) : owner_(std::move(owner)) {}
      batch_type& operator*() const { return owner_->current(); }
      iterator& operator++() {
        owner_->advance();
        return *this;
      }
      void operator++(int) { ++*this; }
      friend bool operator==(const iterator& i, std::default_sentinel_t) { return i.finished(); }

     private:
      [[nodiscard]] bool finished() const { return owner_->finished(); }
      std::shared_ptr<pass> owner_;
    };
    [[nodiscard]] const IndexBatches& index_batches() const noexcept { return batches_; }

   private:
    batch_type& current() {
      if (!current_) {
        if (!workers_) return current_.emplace(loader_->load(*next_));
        top_up();
        current_.emplace(ahead_.front().get());  // the loader's exception, at the batch it belongs to
      }
      return *current_;
    }
    void advance() {
      current_.reset();
      if (ahead_.empty()) {
        ++next_;  // not loaded: passed over
        return;
      }
      ahead_.pop_front();
      top_up();
      if (finished()) workers_.reset();  // a pass's own workers stop at its end
    }
    [[nodiscard]] bool finished() const { return ahead_.empty() && next_ == std::default_sentinel; }
    /// Queues loads until the batch in use and `num_workers * prefetch_factor` beyond it are loaded or loading.
    void top_up() {
      const auto& options = loader_->options_;
      const auto window = static_cast<std::size_t>(options.num_workers * options.prefetch_factor) + 1;
      for (; ahead_.size() < window && next_ != std::default_sentinel; ++next_) {
        auto loaded = std::make_shared<std::promise<batch_type>>();
        ahead_.push_back(loaded->get_future());
        workers_->run([loader = loader_, indices = std::vector<std::int64_t>(*next_), loaded, abandoned = abandoned_] {
          if (abandoned->load()) return;
          try {
            loaded->set_value(loader->load(indices));
          } catch (...) {
            loaded->set_exception(std::current_exception());
          }
        });
      }
    }

    const data_loader* loader_;
    IndexBatches batches_;
    decltype(std::declval<IndexBatches&>().begin()) next_;  // the next batch to load (or to pass over)
    std::optional<batch_type> current_;
    std::deque<std::future<batch_type>> ahead_;  // the batch in use, then those loading ahead, in order
    std::shared_ptr<std::atomic<bool>> abandoned_ = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<detail::worker_threads> workers_;  // last: joined before what its jobs refer to goes
  };

  /// Starts a new pass, drawing this epoch's order and advancing the epoch.
  template <class IndexBatches>
  static auto start(std::shared_ptr<pass<IndexBatches>> p) {
    return typename pass<IndexBatches>::iterator(std::move(p));
  }
  [[nodiscard]] std::int64_t next_epoch() const noexcept { return epoch_++; }

  /// One pass over every batch (one process): an epoch.
  [[nodiscard]] auto begin() const {
    return start(std::make_shared<pass<all_batches>>(*this, all_batches{index_batches(next_epoch())}));
  }
  [[nodiscard]] static constexpr std::default_sentinel_t end() noexcept { return {}; }
  [[nodiscard]] std::size_t size() const {
    const auto full = size_ / options_.batch_size;
    return static_cast<std::size_t>(options_.drop_last || size_ % options_.batch_size == 0 ? full : full + 1);
  }

  /// The epoch the next pass draws its permutation for; each pass advances it when it starts, `set_epoch` sets it.
  void set_epoch(std::int64_t epoch) noexcept { epoch_ = epoch; }
  [[nodiscard]] std::int64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] std::int64_t dataset_size() const noexcept { return size_; }
  [[nodiscard]] const loader_options& options() const noexcept { return options_; }

 private:
  /// Every index batch of the epoch as a range with a sentinel, like the sharded view.
  struct all_batches {
    std::vector<std::vector<std::int64_t>> batches;
    struct iterator {
      const std::vector<std::vector<std::int64_t>>* batches;
      std::size_t i = 0;
      const std::vector<std::int64_t>& operator*() const { return (*batches)[i]; }
      iterator& operator++() {
        ++i;
        return *this;
      }
      friend bool operator==(const iterator& it, std::default_sentinel_t) { return it.i == it.batches->size(); }
    };
    iterator begin() const { return {&batches}; }
  };

  /// The sample at `index`; a failure names it.
  [[nodiscard]] sample_type load_sample(std::int64_t index) const {
    try {
      return detail::dataset_get(dataset_.get(), index);
    } catch (...) {
      std::throw_with_nested(std::runtime_error("accel::data_loader: loading sample " + std::to_string(index) +
                                                " failed: " + detail::failure_text(std::current_exception())));
    }
  }
  /// The threads a new pass loads on: none without `num_workers`, the loader's own with `persistent_workers`,
  /// else new ones for the pass.
  [[nodiscard]] std::shared_ptr<detail::worker_threads> workers() const {
    if (options_.num_workers == 0) return nullptr;
    if (!options_.persistent_workers) return std::make_shared<detail::worker_threads>(options_.num_workers);
    if (!persistent_workers_) persistent_workers_ = std::make_shared<detail::worker_threads>(options_.num_workers);
    return persistent_workers_;
  }

  mutable detail::stored<Dataset> dataset_;
  loader_options options_;
  std::int64_t size_;
  mutable std::int64_t epoch_ = 0;
  mutable std::shared_ptr<detail::worker_threads> persistent_workers_;  // last: joined while the dataset is here
};

template <class Dataset>
data_loader(Dataset&&, const loader_options&) -> data_loader<Dataset>;

namespace detail {
/// A range of samples without a size, read front to back (a stream, the lines of a file, a generator; Python's
/// iterable datasets): batched as it is read, and shared between processes as Accelerate's IterableDatasetShard.
template <class D>
concept sample_stream = std::ranges::input_range<D> && !std::ranges::sized_range<D> && !indexed_dataset<D>;
}  // namespace detail

/// `data_loader` over a sample stream: each pass reads the stream from `begin()` on and collates every
/// `batch_size` samples (the last batch short unless `drop_last`). Shared between P processes (what `prepare` does
/// under `data_parallel`, through `sharded_stream`), every process reads the whole stream and keeps its part of
/// each round of `batch_size * P` samples (`batch_size` with `split_batches`); a last, incomplete round is
/// completed from the first round's samples (from its own, when it is the first), unless `drop_last`.
template <class Stream>
  requires detail::sample_stream<std::remove_reference_t<Stream>>
class data_loader<Stream> {
  using stream_type = std::remove_reference_t<Stream>;

 public:
  using sample_type = std::ranges::range_value_t<stream_type>;
  using batch_type = decltype(detail::collation<sample_type>::collate(std::declval<std::vector<sample_type>>()));

  data_loader(Stream&& stream, const loader_options& options)
      : stream_(std::forward<Stream>(stream)), options_(options) {
    if (options_.batch_size < 1)
      throw std::invalid_argument("accel::data_loader: batch_size = " + std::to_string(options_.batch_size) +
                                  " must be at least 1");
    if (options_.shuffle)
      throw std::invalid_argument(
          "accel::data_loader: a stream of samples (a range without a size) cannot be shuffled: it is read front to "
          "back; shuffle its source, or give it a size and random access");
    if (options_.num_workers > 0)
      throw std::invalid_argument(
          "accel::data_loader: num_workers needs random access to the samples; a stream (a range without a size) is "
          "read in the loop: set num_workers = 0");
  }

  /// One pass over the stream: this process's batches under `sharing` (its batch size and drop_last are the
  /// loader's). Counts the samples read into `*read` when the stream ends.
  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    iterator(const data_loader& loader, const shard_options& sharing, std::int64_t* read)
        : loader_(&loader),
          it_(std::ranges::begin(loader.stream_.get())),
          end_(std::ranges::end(loader.stream_.get())),
          round_(sharing.split_batches ? *sharing.batch_size : *sharing.batch_size * sharing.num_processes),
          mine_(sharing.split_batches ? *sharing.batch_size / sharing.num_processes : *sharing.batch_size),
          first_(static_cast<std::size_t>(sharing.process_index) * static_cast<std::size_t>(mine_)),
          alone_(sharing.num_processes == 1),
          read_(read) {
      next();
    }
    batch_type& operator*() const { return *batch_; }
    iterator& operator++() {
      next();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& i, std::default_sentinel_t) { return !i.batch_.has_value(); }

   private:
    /// Reads up to the end of the next round and keeps this process's part of it.
    void next() {
      batch_.reset();
      while (!ended_ && it_ != end_) {
        round_samples_.push_back(*it_);
        ++it_;
        ++samples_;
        if (std::ssize(round_samples_) == round_) return keep_mine();
      }
      if (!ended_) {
        ended_ = true;
        if (read_) *read_ = samples_;
        if (!round_samples_.empty() && !loader_->options_.drop_last) {
          if (alone_) return keep_all();
          if (first_round_.empty()) first_round_ = round_samples_;
          while (std::ssize(round_samples_) < round_)
            round_samples_.insert(round_samples_.end(), first_round_.begin(), first_round_.end());
          round_samples_.resize(static_cast<std::size_t>(round_));
          keep_mine();
        }
      }
    }
    void keep_mine() {
      if (first_round_.empty()) first_round_ = round_samples_;
      const auto from = round_samples_.begin() + static_cast<std::ptrdiff_t>(first_);
      batch_.emplace(detail::collation<sample_type>::collate(std::vector<sample_type>(from, from + mine_)));
      round_samples_.clear();
    }
    void keep_all() {
      batch_.emplace(detail::collation<sample_type>::collate(std::move(round_samples_)));
      round_samples_.clear();
    }

    const data_loader* loader_;
    std::ranges::iterator_t<stream_type> it_;
    std::ranges::sentinel_t<stream_type> end_;
    std::int64_t round_;  // samples per round: the global batch
    std::int64_t mine_;   // this process's part of a round
    std::size_t first_;   // where its part starts
    bool alone_;
    std::int64_t* read_;
    std::vector<sample_type> round_samples_;
    std::vector<sample_type> first_round_;  // to complete the last round from
    std::int64_t samples_ = 0;
    bool ended_ = false;
    mutable std::optional<batch_type> batch_;
  };

  /// One pass over the stream, every batch (one process).
  [[nodiscard]] iterator begin() const { return start({.batch_size = options_.batch_size}, nullptr); }
  [[nodiscard]] iterator start(const shard_options& sharing, std::int64_t* read) const {
    ++epoch_;
    return iterator(*this, sharing, read);
  }
  [[nodiscard]] static constexpr std::default_sentinel_t end() noexcept { return {}; }

  /// Passes started (a stream has no order to draw: the epoch only counts, and a checkpoint restores it).
  void set_epoch(std::int64_t epoch) noexcept { epoch_ = epoch; }
  [[nodiscard]] std::int64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] const loader_options& options() const noexcept { return options_; }

 private:
  mutable detail::stored<Stream> stream_;
  loader_options options_;
  mutable std::int64_t epoch_ = 0;
};

/// A stream data loader's batches for one process of several (Accelerate's IterableDatasetShard): what `prepare`
/// iterates under `data_parallel`. Every process reads the whole stream. `Loader` is `data_loader<S>&` or
/// `data_loader<S>`.
template <class Loader>
class sharded_stream {
  using loader_type = std::remove_reference_t<Loader>;

 public:
  sharded_stream(Loader&& loader, shard_options options) : loader_(std::forward<Loader>(loader)), options_(options) {
    options_.batch_size = loader_.get().options().batch_size;
    options_.drop_last = loader_.get().options().drop_last;
    detail::validate(options_);
  }
  [[nodiscard]] auto begin() const {
    read_ = -1;
    return loader_.get().start(options_, &read_);
  }
  [[nodiscard]] static constexpr std::default_sentinel_t end() noexcept { return {}; }
  [[nodiscard]] const shard_options& options() const noexcept { return options_; }
  /// Real samples of the last round (what `gather_for_metrics` keeps of it), once the stream has ended: the
  /// samples read modulo the round; -1 before, with drop_last, or on one process.
  [[nodiscard]] std::int64_t remainder() const noexcept {
    if (read_ < 0 || options_.drop_last || options_.num_processes == 1) return -1;
    const auto round = options_.split_batches ? *options_.batch_size : *options_.batch_size * options_.num_processes;
    return read_ % round;
  }
  [[nodiscard]] loader_type& loader() const noexcept { return loader_.get(); }

 private:
  mutable detail::stored<Loader> loader_;
  shard_options options_;
  mutable std::int64_t read_ = -1;
};

/// A data loader's batches for one process of several: each pass shards that epoch's index batches (see
/// `views::shard`) before loading any sample. What `prepare` iterates under `data_parallel`. `Loader` is
/// `data_loader<D>&` (referred to) or `data_loader<D>` (owned).
template <class Loader>
class sharded_loader {
  using loader_type = std::remove_reference_t<Loader>;
  using index_shards = shard_view<std::vector<std::vector<std::int64_t>>>;
  using pass_type = typename loader_type::template pass<index_shards>;

 public:
  sharded_loader(Loader&& loader, shard_options options) : loader_(std::forward<Loader>(loader)), options_(options) {
    options_.batch_size = loader_.get().options().batch_size;
    options_.drop_last = loader_.get().options().drop_last;
    detail::validate(options_);
  }
  [[nodiscard]] auto begin() const {
    const auto& loader = loader_.get();
    index_shards shards(loader.index_batches(loader.next_epoch()), options_);
    shards.skip_input_batches(std::exchange(skip_input_, 0));
    current_ = std::make_shared<pass_type>(loader, std::move(shards));
    return loader_type::start(current_);
  }
  /// See `shard_view::skip_input_batches` (the index batches passed over are never loaded).
  void skip_input_batches(std::size_t n) const noexcept { skip_input_ = n; }
  [[nodiscard]] const shard_options& options() const noexcept { return options_; }
  /// See `shard_view::set_even_batches`.
  void set_even_batches(bool even) noexcept { options_.even_batches = even; }
  /// This process's number of batches in a pass.
  [[nodiscard]] std::size_t size() const {
    return index_shards(std::vector<std::vector<std::int64_t>>(loader_.get().size()), options_).size();
  }
  [[nodiscard]] static constexpr std::default_sentinel_t end() noexcept { return {}; }
  /// See `shard_view::remainder`.
  [[nodiscard]] std::int64_t remainder() const noexcept {
    return current_ ? current_->index_batches().remainder() : -1;
  }
  [[nodiscard]] loader_type& loader() const noexcept { return loader_.get(); }

 private:
  mutable detail::stored<Loader> loader_;
  shard_options options_;
  mutable std::shared_ptr<pass_type> current_;
  mutable std::size_t skip_input_ = 0;
};

namespace detail {
template <class T>
inline constexpr bool is_data_loader = false;
template <class D>
inline constexpr bool is_data_loader<data_loader<D>> = true;
template <class T>
inline constexpr bool is_stream_loader = false;
template <class S>
inline constexpr bool is_stream_loader<data_loader<S>> = sample_stream<std::remove_reference_t<S>>;
}  // namespace detail

}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/data_loader.ipp"
#endif
