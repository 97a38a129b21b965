/// \file
/// Rank-local loading: each process reads, of a checkpoint's safetensors files, only the bytes of what it holds
/// (pread of each tensor's byte range, or of the part of it that overlaps this process's slice), never a file whole
/// unless it holds all of it. A sharded-format checkpoint saved by P processes loads so under P' processes: process
/// r' reads, from each saved file r whose slice of a tensor overlaps its own, the overlapping bytes; a full
/// checkpoint's `model.safetensors`, the range of this process's slice of each tensor.
///
/// Integrity: every file's size is checked against the manifest and its header parsed before any data is read, and
/// every range is checked against the header (within the data, the dtype and element count the layout gives). A
/// file whose every byte this process reads (header and data) is checked against its CRC-32C as well; one read only
/// in part has no checksum of its parts in the manifest, so its data is trusted as the size and header allow.
///
/// The weights' bytes are read once, straight into the parameters' storage (at rest: this process's slices), and
/// only after every check passed on every process (`planned_read`): a file read whole is checksummed first where its
/// bytes lie in the page cache, mapped, not read (`opened_files::checksum_range`), so that a failed check leaves the
/// program as it was without an undo copy of the weights, and nothing of them is allocated.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "../../model_weights.hpp"
#include "../../safetensors.hpp"
#include "../sharding/shard_layout.hpp"
#include "../support/crc32c.hpp"
#include "agreement.hpp"
#include "format.hpp"
#include "manifest.hpp"
#include "sharded_format.hpp"

namespace accel::detail {

/// What this process holds of one tensor: elements [begin, begin + length) of its flattened values (a policy's
/// slice), or all of them in its shape (`whole`).
struct held_part {
  std::int64_t begin = 0;
  std::int64_t length = 0;
  bool whole = true;
  std::vector<std::int64_t> sizes;  // the whole tensor's shape, of a slice (the parameter may be its slice only)

  /// All `numel` elements of a tensor held whole.
  ACCEL_DECL static held_part all_of(std::int64_t numel);
};

/// What this process holds of each model's tensors and of each parameter's optimizer state, by name (the state by
/// `state_field_name(model, parameter, "")`); a name not listed is held whole.
struct held_parts {
  std::vector<std::map<std::string, held_part>> weights;
  std::map<std::string, held_part> states;

  [[nodiscard]] ACCEL_DECL held_part weight(std::size_t model, const std::string& name) const;
  [[nodiscard]] ACCEL_DECL held_part state(const std::string& parameter) const;
};

/// Adds to `parts` what this process holds of model `index` (`model`) under `parallel`: the slice `shard_of` gives of
/// each parameter the policy shards, for its optimizer state; for the weights too where the policy keeps no more than
/// its slices of the parameters (`keeps_parameter_slices`).
template <class Parallel>
void add_held_parts(held_parts& parts, const Parallel& parallel, std::size_t index, const torch::nn::Module& model) {
  if (parts.weights.size() <= index) parts.weights.resize(index + 1);
  for (const auto& item : model.named_parameters())
    if (const auto shard = parallel.shard_of(item.value())) {
      const held_part part{
          .begin = shard->begin, .length = shard->slice.numel(), .whole = false, .sizes = shard->sizes};
      parts.states[state_field_name(index, item.key(), "")] = part;
      if constexpr (Parallel::keeps_parameter_slices) parts.weights[index][item.key()] = part;
    }
}

/// Model `index`'s parameters and buffers (`model`'s `state_of`) in their whole shapes: those this process holds a
/// slice of as meta tensors of the whole shape (between steps such a parameter is its slice only).
ACCEL_DECL safetensors::tensor_list whole_state_of(const torch::nn::Module& model, std::size_t index,
                                                   const held_parts& parts);

/// Of model `index`'s whole tensors, read from a file read whole, keeps this process's slice of each it holds a slice
/// of (`parts`); gives their names (held_weights' `sliced`).
ACCEL_DECL std::set<std::string> keep_held_slices(std::map<std::string, at::Tensor>& tensors, std::size_t index,
                                                  const held_parts& parts);

/// Where the bytes of one tensor as this process holds it lie (`ranged_reader::plan`): each byte range of a file and
/// the byte of the tensor it fills. Checked against the files' headers when planned; read by `read_into`.
struct planned_read {
  struct range {
    std::size_t file = 0;
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
    std::uint64_t at = 0;  // from the tensor's first byte
  };
  std::vector<range> ranges;
  at::ScalarType type = at::kFloat;
  std::vector<std::int64_t> shape;  // the tensor's, held whole; {its length}, a slice
  std::string what;
};

/// Reads byte ranges of a checkpoint's safetensors files (opened by its manifest), and checks each file this process
/// reads whole against its CRC-32C (`check_whole_files`): the ranges read before, from the bytes read; the ranges
/// planned only, from the file.
class ranged_reader {
 public:
  /// One tensor's elements [begin, begin + length) (flattened) stored in file `file` from byte `offset`.
  struct piece {
    std::size_t file = 0;
    std::int64_t begin = 0;
    std::int64_t length = 0;
    std::uint64_t offset = 0;
  };
  struct opened {
    std::string name;
    std::string head;  // the 8-byte length and the header, as read
    std::uint64_t data_begin = 0;
    std::uint64_t size = 0;
    std::map<std::string, safetensors::detail::header_parser::entry> entries;
    std::vector<std::string> order;
  };

  /// `checksums`: the manifest's CRC-32Cs are checked (false for files outside a checkpoint: `plain_files`).
  ranged_reader(std::filesystem::path directory, const checkpoint_manifest& manifest, bool checksums = true)
      : directory_(std::move(directory)), manifest_(manifest), checksums_(checksums) {}  // its files kept open

  /// Opens `name` once (its size against the manifest, its header read and parsed); returns its number.
  ACCEL_DECL std::size_t open(const std::string& name);
  [[nodiscard]] const opened& file(std::size_t f) const { return files_.at(f); }

  /// Tensor `tensor`'s entry in file `f`, checked: a dtype accel reads, `elements` of it (when not negative), its
  /// bytes within the file's data. Returns its type and the offset of its first byte in the file.
  ACCEL_DECL std::pair<at::ScalarType, std::uint64_t> locate(std::size_t f, const std::string& tensor,
                                                             std::int64_t elements);

  /// Where the bytes of `part` of a tensor of `shape` and `type` whose elements lie in `pieces` are: only the
  /// overlapping bytes of each piece, checked to cover it. Nothing is read yet (`read_into`).
  ACCEL_DECL planned_read plan(const std::vector<piece>& pieces, at::ScalarType type,
                               const std::vector<std::int64_t>& shape, held_part part, const std::string& what);
  /// The same read now, into a new tensor in its shape (whole) or flat (a slice).
  ACCEL_DECL at::Tensor read(const std::vector<piece>& pieces, at::ScalarType type,
                             const std::vector<std::int64_t>& shape, held_part part, const std::string& what);
  /// Reads `planned` into `destination` in place: straight into its storage where it is a contiguous CPU tensor of
  /// the type and size read (a parameter at rest), else through a new tensor copied in (a parameter on a GPU).
  ACCEL_DECL void read_into(const planned_read& planned, const at::Tensor& destination) const;

  /// `problem`, unless file `f` is damaged (checked whole against its CRC-32C, which then throws): a header that
  /// parses but says something else than was saved is called damaged, as a file read whole would be.
  [[nodiscard]] ACCEL_DECL checkpoint_error damaged_or(std::size_t f, const std::string& problem) const;
  /// Runs `check` (the weights' names, shapes and dtypes against the model); should it fail, every file opened is
  /// first checked whole, so that a damaged file is called damaged rather than unfit.
  template <class Check>
  void check_fit(Check&& check) const {
    try {
      std::forward<Check>(check)();
    } catch (const checkpoint_error&) {
      for (const auto& file : files_)
        if (checksums_) check_checkpoint_file(directory_, file.name, manifest_);
      throw;
    }
  }

  /// Checks every file this process reads whole (its header and data, without a gap) against its CRC-32C, as
  /// `read_checkpoint_file` checks a file it reads; the others were checked for size and header only.
  ACCEL_DECL void check_whole_files() const;

 private:
  struct read_span {
    std::size_t file;
    std::uint64_t offset;
    const char* at;  // the bytes read; none, planned only
    std::uint64_t bytes;
    at::Tensor owner;  // keeps `at` alive until the check
  };

  /// The CRC-32C of `file`, whose every byte after its header `chain` covers: of the bytes a span read, or, of a
  /// span only planned, of the file's bytes (mapped, not read).
  [[nodiscard]] ACCEL_DECL std::uint32_t checksum_of(const opened& file,
                                                     const std::vector<const read_span*>& chain) const;
  ACCEL_DECL planned_read plan_ranges(const std::vector<piece>& pieces, at::ScalarType type,
                                      const std::vector<std::int64_t>& shape, held_part part,
                                      const std::string& what) const;
  ACCEL_DECL void read_ranges(const planned_read& planned, const at::Tensor& into) const;

  /// A file whose length or header cannot be read: checked whole, so that a damaged file is called damaged (its
  /// checksum), and otherwise refused as truncated or corrupt.
  ACCEL_DECL checkpoint_error whole_file_problem(const std::string& name, bool header = false) const;

  std::filesystem::path directory_;
  checkpoint_manifest manifest_;
  bool checksums_;
  std::vector<opened> files_;
  std::vector<read_span> spans_;
};

/// Where a model's tensors as this process holds them lie: whole (in their shapes), or its slice (flat) of those
/// `sliced` names.
struct held_weights {
  std::map<std::string, planned_read> reads;
  std::set<std::string> sliced;
};

/// The pieces of tensor `name` (`numel` elements of `type`) spread over `processes` files (`file_of(r)`, the r-th
/// holding elements [r c, (r + 1) c), c = ceil(numel / processes)), of the files that hold some of `part`: only
/// those are opened.
template <class FileOf>
std::vector<ranged_reader::piece> spread_pieces(ranged_reader& reader, FileOf&& file_of, std::int64_t processes,
                                                const std::string& name, std::int64_t numel, held_part part,
                                                at::ScalarType type) {
  if (part.whole) part = held_part::all_of(numel);
  std::vector<ranged_reader::piece> pieces;
  for (int r = 0; r < processes; ++r) {
    const auto span = shard_span_of(numel, r, static_cast<int>(processes));
    if (std::max(span.begin, part.begin) >= std::min(span.begin + span.length, part.begin + part.length)) continue;
    const auto f = reader.open(file_of(r));
    const auto [stored, offset] = reader.locate(f, name, span.length);
    if (stored != type)
      throw reader.damaged_or(f, "accel::load_state: " + reader.file(f).name + " holds " + name +
                                     " in another dtype than process 0's file (a damaged checkpoint?)");
    pieces.push_back({.file = f, .begin = span.begin, .length = span.length, .offset = offset});
  }
  return pieces;
}

/// Where model `index`'s tensors of a sharded-format checkpoint as this process holds them (`parts`) lie, checked
/// against `model` (names, full shapes, dtypes: `check_weights_fit`'s error, `what`).
ACCEL_DECL held_weights read_held_shards(ranged_reader& reader, const shard_layout_table& table, std::size_t index,
                                         const held_parts& parts, const torch::nn::Module& model,
                                         const std::string& what);

/// Where model `index`'s tensors in the safetensors files `files` (a full checkpoint's `model.safetensors`, or
/// Hugging Face's sharded files) as this process holds them lie: each tensor's byte range, or the range of this
/// process's slice of it; checked against `model` (names, shapes, dtypes).
ACCEL_DECL held_weights read_held_files(ranged_reader& reader, const std::vector<std::size_t>& files, std::size_t index,
                                        const held_parts& parts, const torch::nn::Module& model,
                                        const std::string& what);

/// Optimizer `index`'s state of a sharded-format checkpoint as this process holds it: each field by its name
/// (`state_field_name`), this process's slice (flat) of a parameter `parts` lists, else the whole tensor shaped as
/// its parameter; steps as 0-d tensors.
ACCEL_DECL std::map<std::string, at::Tensor> read_held_optimizer_state(ranged_reader& reader,
                                                                       const shard_layout_table& table,
                                                                       std::size_t index, const held_parts& parts);

/// Reads `reads` (a held_weights', checked) into `module`'s parameters and buffers, straight into their storage:
/// those `sliced` names into the parameter at rest, which is then this process's slice only (`with_weights_to_load`).
/// Everything was checked before; should a read still fail (an I/O error), the weights read before it stay.
ACCEL_DECL void read_held_weights(const ranged_reader& reader, torch::nn::Module& module,
                                  const std::map<std::string, planned_read>& reads,
                                  const std::set<std::string>& sliced);

/// Copies `tensors` (read whole and checked) into `module`'s parameters and buffers, in place: those `sliced` names
/// into the parameter at rest (keep_held_slices).
ACCEL_DECL void copy_held_weights(torch::nn::Module& module, const std::map<std::string, at::Tensor>& tensors,
                                  const std::set<std::string>& sliced);

/// Runs `action` with `module`'s weights where a rank-local load writes them: at rest, nothing gathered, under a
/// policy that `keeps_parameter_slices` (the only policies whose weights a load reads in slices); else full.
template <class Parallel, class Action>
void with_weights_to_load(Parallel& parallel, torch::nn::Module& module, Action&& action) {
  if constexpr (Parallel::keeps_parameter_slices)
    parallel.with_parameters_at_rest(module, std::forward<Action>(action));
  else
    parallel.with_full_parameters(module, std::forward<Action>(action));
}

/// Safetensors files outside a checkpoint (`names`, in `directory`), opened for ranged reads as a manifest opens a
/// checkpoint's files: their sizes as they are now, no checksums (a ranged_reader of them checks none).
ACCEL_DECL checkpoint_manifest plain_files(const std::filesystem::path& directory,
                                           const std::vector<std::string>& names);

/// The directory and the safetensors files of `where`: a `.safetensors` file, or a directory holding Hugging Face's
/// `model.safetensors.index.json` (the files its weight map names) or `model.safetensors`.
ACCEL_DECL std::pair<std::filesystem::path, std::vector<std::string>> model_files_of(
    const std::filesystem::path& where);

/// Loads the weights in `where` (model_files_of) into `module`, a model prepared under `parallel`, each process
/// reading only the byte ranges of what it holds (its slices where the policy `keeps_parameter_slices`), straight into
/// the parameters. Checked against the module on every process before anything changes; a failure anywhere throws
/// everywhere. A collective.
template <class Parallel>
void load_held_model(Parallel& parallel, torch::nn::Module& module, const std::filesystem::path& where) {
  with_weights_to_load(parallel, module, [&] {
    std::optional<ranged_reader> reader;
    held_weights held;
    on_every_process_or_none(parallel, "load_model", "reading " + where.string(), [&] {
      held_parts parts;
      add_held_parts(parts, parallel, 0, module);
      const auto [directory, names] = model_files_of(where);
      reader.emplace(directory, plain_files(directory, names), /*checksums=*/false);
      std::vector<std::size_t> files;
      for (const auto& name : names) files.push_back(reader->open(name));
      held = read_held_files(*reader, files, 0, parts, module,
                             "accel::load_model: the weights in " + where.string() + " do not fit this model");
    });
    on_every_process_or_none(parallel, "load_model", "reading " + where.string() + " into the model",
                             [&] { read_held_weights(*reader, module, held.reads, held.sliced); });
  });
}

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/rank_local.ipp"
#endif
