/// \file
/// `prepared_range`: what `accelerator::prepare` returns for a range of batches. Iterating it yields the user's
/// batches moved to the accelerator's device, without copying the underlying range: the current batch and the
/// next one (read ahead so that the last batch is marked as such before it is yielded) are in memory.
///
/// Any range with `begin()`/`end()` works, including LibTorch's data loaders, whose iterators are not C++20
/// iterators (`operator*` is non-const, there is no `it++`): the prepared range only uses `++it`, `*it` and
/// `it != end` on them, and its own iterator is a proper `std::input_iterator`.
#pragma once

#include <c10/core/Device.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "batch_range.hpp"
#include "checkpoint_error.hpp"
#include "detail/prepared/accelerator_access.hpp"
#include "detail/checkpoint/slot.hpp"
#include "detail/prepared/prepared_handle.hpp"
#include "detail/support/stored.hpp"
#include "device.hpp"
#include "shard.hpp"

namespace accel {
namespace detail {
struct no_loader {
  void set_epoch(std::int64_t) {}
};
/// The data loader behind a prepared range (which sets its epoch on resume), if there is one.
template <class R>
auto* loader_of(R& range) {
  if constexpr (requires { range.loader(); })
    return &range.loader();
  else if constexpr (requires { range.set_epoch(std::int64_t{}); })
    return &range;
  else
    return static_cast<no_loader*>(nullptr);
}
/// How the range behind a prepared range shares its input between processes (one process: as it is).
template <class R>
shard_options sharding_of(const R& range) {
  if constexpr (requires {
                  { range.options() } -> std::convertible_to<shard_options>;
                })
    return range.options();
  else
    return {};
}
}  // namespace detail

/// `Range` is `R&` when the user passed an lvalue (kept by reference) or `R` for an rvalue (owned).
template <class Range, class Accelerator>
  requires batch_range<Range>
class prepared_range : detail::prepared_tag {
  using base_range = std::remove_reference_t<Range>;
  using base_iterator = decltype(detail::adl::range_begin(std::declval<base_range&>()));
  using base_sentinel = decltype(detail::adl::range_end(std::declval<base_range&>()));

 public:
  /// What iterating yields: the underlying batch type, as values (see `placed_t`).
  using batch_type = placed_t<decltype(*std::declval<base_iterator&>())>;

  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;
    using iterator_category = std::input_iterator_tag;  // for std::iterator_traits, which range-v3 reads
    using reference = batch_type&;
    using pointer = void;

    iterator() = default;  // range-v3's views require it
    iterator(base_iterator base, base_sentinel end, const prepared_range& range, std::size_t skip)
        : base_(std::move(base)), end_(std::move(end)), range_(&range) {
      for (; skip > 0 && base_ != end_; --skip) ++base_;  // resuming: these batches are not read
      prefetch();
      advance();
    }

    /// The current batch, already on the device.
    batch_type& operator*() const noexcept { return *batch_; }
    iterator& operator++() {
      detail::accelerator_access::after_batch(*range_->accelerator_, range_->pass_.get());
      advance();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept { return !it.batch_.has_value(); }

   private:
    /// Reads one batch ahead, so that the last batch is known as such before it is yielded (Accelerate marks
    /// `end_of_dataloader` then, for accumulation to synchronise and gather_for_metrics to drop padding).
    void prefetch() {
      if (base_ != end_) {
        next_.emplace(range_->place(*base_));
        ++base_;
      } else {
        next_.reset();
      }
    }
    void advance() {
      batch_ = std::move(next_);
      next_.reset();
      auto& pass = *range_->pass_;
      if (batch_) {
        prefetch();
        ++pass.position.batch;
        detail::accelerator_access::batch_yielded(*range_->accelerator_, &pass);
      } else {
        pass.finish();
      }
      const bool last = batch_.has_value() && !next_.has_value();
      pass.on_last_batch = last;
      detail::accelerator_access::set_end_of_dataloader(*range_->accelerator_, last, last ? range_->remainder() : -1);
    }

    base_iterator base_;
    base_sentinel end_;
    const prepared_range* range_ = nullptr;
    mutable std::optional<batch_type> batch_;
    std::optional<batch_type> next_;
  };

  /// Where iteration stands: passes completed, and the index of the current batch in this pass (-1 before the
  /// first). What a checkpoint saves to resume mid-epoch.
  struct position_type {
    std::int64_t epoch = 0;
    std::int64_t batch = -1;
  };

  /// The checkpoint slot (per process: each process has its own shard) reads and writes the position through
  /// pointers that stay valid when the prepared range moves: the range and its pass state never move.
  prepared_range(Range&& range, Accelerator& accelerator)
      : range_(std::forward<Range>(range)),
        accelerator_(&accelerator),
        device_(accelerator.device_placement() ? std::optional<c10::Device>(accelerator.device()) : std::nullopt),
        non_blocking_(accelerator.options().non_blocking),
        registration_(detail::accelerator_access::register_state(accelerator, slot())),
        range_registration_(detail::accelerator_access::register_range(accelerator, even_batches_control())) {}

  /// Starts a pass over the underlying range (a LibTorch loader starts a new epoch here). After
  /// `checkpoint_automatically` with `resume::latest`, the first pass loads the newest checkpoint first.
  [[nodiscard]] iterator begin() const {
    detail::accelerator_access::before_pass(*accelerator_);
    auto& range = range_.get();
    const auto skip = std::exchange(pass_->skip, 0);
    pass_->position.batch = -1 + static_cast<std::int64_t>(skip);
    pass_->input_offset = std::exchange(pass_->input_skip, 0);
    if constexpr (requires { range.skip_input_batches(std::size_t{}); })
      range.skip_input_batches(static_cast<std::size_t>(pass_->input_offset));
    return iterator(detail::adl::range_begin(range), detail::adl::range_end(range), *this, skip);
  }

  [[nodiscard]] position_type position() const noexcept { return pass_->position; }

  /// The next pass starts after its first `n` batches (this process's), without reading them: resuming
  /// mid-epoch (Accelerate's `skip_first_batches`). Later passes are whole.
  void skip_first_batches(std::size_t n) noexcept { pass_->skip = n; }

  /// Samples of the last global batch that are real (see `shard_view::remainder`); -1 when nothing was padded.
  [[nodiscard]] std::int64_t remainder() const noexcept {
    if constexpr (requires(const base_range& r) { r.remainder(); })
      return range_.get().remainder();
    else
      return -1;
  }
  [[nodiscard]] static constexpr std::default_sentinel_t end() noexcept { return {}; }

  /// Number of batches, when the underlying range knows it.
  [[nodiscard]] auto size() const
    requires requires(const base_range& r) { detail::adl::range_size(r); }
  {
    return detail::adl::range_size(std::as_const(range_.get()));
  }

  /// The user's range.
  [[nodiscard]] base_range& unwrap() const noexcept { return range_.get(); }

 private:
  template <class Batch>
  batch_type place(Batch&& batch) const {
    return device_ ? send_to_device(std::forward<Batch>(batch), *device_, non_blocking_)
                   : batch_type(std::forward<Batch>(batch));
  }

  struct pass_state {
    position_type position;
    std::size_t skip = 0;           // batches of this process the next pass passes over
    std::int64_t input_skip = 0;    // batches of the input the next pass passes over, before sharing it out
    std::int64_t input_offset = 0;  // the same for the current pass
    bool on_last_batch = false;     // the current batch is its pass's last

    void finish() noexcept {
      if (position.batch >= 0 || input_offset > 0) ++position.epoch;
      position.batch = -1;
      input_offset = 0;
      on_last_batch = false;
    }
    /// Where a resumed run starts: after the current batch, which is done when a checkpoint is taken. On a pass's
    /// last batch that is the start of the next epoch, not an empty rest of this one.
    [[nodiscard]] position_type resume_position() const noexcept {
      return on_last_batch ? position_type{position.epoch + 1, -1} : position;
    }
    /// The same position counted in batches of the input, whatever the number of processes: what converts it.
    [[nodiscard]] std::int64_t resume_input_batches(std::int64_t input_per_batch) const noexcept {
      if (on_last_batch) return 0;
      return input_offset + input_skip + (position.batch + 1) * input_per_batch;
    }
  };

  /// A checkpoint holds the resume position, also as batches of the input; loading it makes the next pass resume
  /// after the last batch done, drawing that epoch's order from a data loader. Saved by another number of
  /// processes, the position converts: the next pass shares out the rest of the input between this run's
  /// processes, so that each sample of the epoch is seen once (docs/checkpoint-format.md).
  detail::checkpoint_slot slot() {
    detail::checkpoint_slot slot{.kind = std::string(detail::checkpoint_files::kind::range),
                                 .scope = detail::state_scope::per_process};
    slot.save = [pass = pass_.get(), range = &range_.get()](torch::serialize::OutputArchive& out) {
      const auto resume = pass->resume_position();
      const auto sharing = detail::sharding_of(*range);
      out.write("epoch", c10::IValue(resume.epoch));
      out.write("batch", c10::IValue(resume.batch));
      out.write("input_batches", c10::IValue(pass->resume_input_batches(detail::input_batches_per_batch(sharing))));
      out.write("processes", c10::IValue(static_cast<std::int64_t>(sharing.num_processes)));
    };
    slot.load = [pass = pass_.get(), range = &range_.get()](torch::serialize::InputArchive& in) {
      c10::IValue epoch, batch, input;
      in.read("epoch", epoch);
      in.read("batch", batch);
      const auto per_batch = detail::input_batches_per_batch(detail::sharding_of(*range));
      // Checkpoints older than "input_batches" were loaded by as many processes as wrote them.
      const auto input_batches = in.try_read("input_batches", input) ? input.toInt() : (batch.toInt() + 1) * per_batch;
      resume_at(*pass, *range, epoch.toInt(), input_batches, per_batch);
      if (auto* loader = detail::loader_of(*range)) loader->set_epoch(pass->position.epoch);
    };
    return slot;
  }
  /// What `join_uneven_inputs` switches: the sharing's even_batches, where the range behind shares whole or split
  /// batches of an input it reads on every process (not a stream, not dispatched batches).
  detail::even_batches_switch even_batches_control() {
    auto* range = &range_.get();
    if constexpr (requires { range->set_even_batches(true); }) {
      if constexpr (requires { range->dispatching(); })
        if (range->dispatching()) return {};
      return {.get = [range] { return range->options().even_batches; },
              .set = [range](bool even) { range->set_even_batches(even); }};
    } else {
      return {};
    }
  }

  /// The next pass resumes epoch `epoch` after `input_batches` batches of the input: whole batches of this process
  /// when they divide evenly (as an uninterrupted run under this number of processes would go on), else the rest
  /// of the input shared out afresh.
  static void resume_at(pass_state& pass, base_range& range, std::int64_t epoch, std::int64_t input_batches,
                        std::int64_t per_batch) {
    if (input_batches % per_batch == 0) {
      pass.position = {epoch, input_batches / per_batch - 1};
      pass.skip = static_cast<std::size_t>(input_batches / per_batch);
      pass.input_skip = 0;
      return;
    }
    if constexpr (requires { range.skip_input_batches(std::size_t{}); }) {
      pass.position = {epoch, -1};
      pass.skip = 0;
      pass.input_skip = input_batches;
    } else {
      throw checkpoint_error("cannot resume under this number of processes: its data position, " +
                             std::to_string(input_batches) +
                             " batches of the input into the epoch, is not a whole number of this run's batches, "
                             "and the range cannot pass over batches of its input; resume with the number of "
                             "processes that saved it");
    }
  }

  detail::pinned<Range> range_;
  Accelerator* accelerator_;
  std::optional<c10::Device> device_;  // empty when device placement is off
  bool non_blocking_;
  std::unique_ptr<pass_state> pass_ = std::make_unique<pass_state>();
  detail::registration registration_;
  detail::registration range_registration_;
};

}  // namespace accel
