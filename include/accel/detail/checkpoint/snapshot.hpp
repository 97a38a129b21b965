/// \file
/// The snapshot an asynchronous save takes before training goes on: `snapshot_buffers`, CPU copies of the live
/// tensors kept from one save to the next (one copy of the training state, whatever the number of saves), and
/// `checkpoint_snapshot`, the parts of one save as the writer produced them, written later by another thread. (The
/// staging directory, `DIR.partial`, is where the files are written: directory.hpp.)
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/output-archive.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../safetensors.hpp"
#include "sharded_format.hpp"

namespace accel::detail {

/// CPU copies of live tensors for a save written in the background. The i-th copy of a save reuses the i-th buffer
/// of the previous save when its shape and dtype match, so that a run of saves keeps one copy of the state in memory
/// and the copies after the first touch no fresh pages. A CUDA tensor's buffer is pinned, and its copy is only
/// enqueued on the device's current stream: the stream runs it before the kernels of the steps that follow (which
/// may change the tensor), while the host goes on training; `wait_for_copies` is what waits for it.
class snapshot_buffers {
 public:
  /// Begins a save's copies.
  void restart() noexcept {
    next_ = 0;
    copied_from_.reset();
    copies_done_ = nullptr;
  }
  /// A copy of `live` (contiguous, on the CPU, not tracked by autograd), valid until the next `restart` and, for a
  /// CUDA tensor, once `wait_for_copies` has returned.
  [[nodiscard]] ACCEL_DECL at::Tensor copy(const at::Tensor& live);
  /// Ends a save's copies: buffers the save did not use are freed; after copies from a CUDA device, an event is
  /// recorded behind them on its stream.
  ACCEL_DECL void finish();
  /// Waits until the save's copies are in the buffers (copies from a CUDA device may still be under way until then):
  /// what reads the buffers on another thread calls it first.
  void wait_for_copies() const {
    if (copies_done_) copies_done_();
  }

 private:
  std::vector<at::Tensor> buffers_;
  std::size_t next_ = 0;
  std::optional<c10::Device> copied_from_;  // the CUDA device this save's copies came from, if any
  std::function<void()> copies_done_;       // waits for the event behind them
};

/// `tensors` with each tensor replaced by its copy in `buffers`.
ACCEL_DECL safetensors::tensor_list snapshot_copy(const safetensors::tensor_list& tensors, snapshot_buffers& buffers);

/// The parts of one save, as checkpoint_writer produces them into it (it is one of the writer's sinks, as the files
/// are), each tensor a copy in the snapshot's buffers: what the background thread writes, with neither the live objects
/// nor the parallel policy. `write_into(files)` hands the parts, in their order, to the sink that writes them.
class checkpoint_snapshot {
 public:
  explicit checkpoint_snapshot(snapshot_buffers& buffers) : buffers_(&buffers) { buffers.restart(); }

  void own_file(const std::string& name, std::string bytes) { own_ = {name, std::move(bytes)}; }
  void own_tensors(const std::string& name, const safetensors::tensor_list& tensors) {
    own_tensors_.emplace_back(name, snapshot_copy(tensors, *buffers_));
  }
  /// A small archive (a scheduler's, `accel_state.bin`): serialised now, whatever it holds.
  ACCEL_DECL void shared_archive(const std::string& name, torch::serialize::OutputArchive& archive);
  ACCEL_DECL void optimizer_archive(const std::string& name, torch::optim::Optimizer& optimizer);
  void models(const std::vector<safetensors::tensor_list>& weights, bool safe_serialization) {
    for (const auto& tensors : weights) weights_.push_back(snapshot_copy(tensors, *buffers_));
    safe_serialization_ = safe_serialization;
  }
  void layout_table(const shard_layout_table& table) { table_ = table; }
  /// Every part taken: the buffers not used are freed.
  void finish() { buffers_->finish(); }
  /// Waits until every copy is in the buffers: the background thread calls it before `write_into`.
  void wait_for_copies() const { buffers_->wait_for_copies(); }

  template <class Sink>
  void write_into(Sink& sink) {
    sink.own_file(own_.first, std::move(own_.second));
    for (const auto& [name, tensors] : own_tensors_) sink.own_tensors(name, tensors);
    for (auto& file : shared_)
      if (file.archive)
        sink.shared_archive(file.name, *file.archive);
      else
        sink.shared_bytes(file.name, file.bytes);
    if (!weights_.empty()) sink.models(weights_, safe_serialization_);
    if (table_) sink.layout_table(*table_);
  }

 private:
  struct shared_file {
    std::string name;
    std::shared_ptr<torch::serialize::OutputArchive> archive;  // holding copies
    std::string bytes;                                         // or serialised already
  };

  snapshot_buffers* buffers_;
  std::pair<std::string, std::string> own_;
  std::vector<std::pair<std::string, safetensors::tensor_list>> own_tensors_;
  std::vector<shared_file> shared_;
  std::vector<safetensors::tensor_list> weights_;
  bool safe_serialization_ = true;
  std::optional<shard_layout_table> table_;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/snapshot.ipp"
#endif
