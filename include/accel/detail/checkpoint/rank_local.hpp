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
  static held_part all_of(std::int64_t numel) {
    held_part part;
    part.length = numel;
    return part;
  }
};

/// What this process holds of each model's tensors and of each parameter's optimizer state, by name (the state by
/// `state_field_name(model, parameter, "")`); a name not listed is held whole.
struct held_parts {
  std::vector<std::map<std::string, held_part>> weights;
  std::map<std::string, held_part> states;

  [[nodiscard]] held_part weight(std::size_t model, const std::string& name) const {
    if (model >= weights.size()) return {};
    const auto found = weights[model].find(name);
    return found == weights[model].end() ? held_part{} : found->second;
  }
  [[nodiscard]] held_part state(const std::string& parameter) const {
    const auto found = states.find(parameter);
    return found == states.end() ? held_part{} : found->second;
  }
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
inline safetensors::tensor_list whole_state_of(const torch::nn::Module& model, std::size_t index,
                                               const held_parts& parts) {
  auto state = state_of(model);
  for (auto& [name, tensor] : state)
    if (const auto part = parts.weight(index, name); !part.whole)
      tensor = at::empty(part.sizes, tensor.options().device(at::kMeta));
  return state;
}

/// Of model `index`'s whole tensors, read from a file read whole, keeps this process's slice of each it holds a slice
/// of (`parts`); gives their names (held_weights' `sliced`).
inline std::set<std::string> keep_held_slices(std::map<std::string, at::Tensor>& tensors, std::size_t index,
                                              const held_parts& parts) {
  std::set<std::string> sliced;
  for (auto& [name, tensor] : tensors)
    if (const auto part = parts.weight(index, name); !part.whole) {
      tensor = tensor.reshape({-1}).narrow(0, part.begin, part.length).clone();
      sliced.insert(name);
    }
  return sliced;
}

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
  std::size_t open(const std::string& name) {
    for (std::size_t f = 0; f < files_.size(); ++f)
      if (files_[f].name == name) return f;
    const auto& saved = listed_file(directory_, name, manifest_);
    const auto size_now = manifest_.opened() != nullptr ? manifest_.opened()->size(name) : std::nullopt;
    if (!size_now) throw missing_checkpoint_file(directory_ / name);
    check_as_saved(directory_ / name, saved, *size_now, saved.crc32c);  // the size; the checksum once read whole
    opened file{
        .name = name, .head = std::string(8, '\0'), .data_begin = 0, .size = saved.size, .entries = {}, .order = {}};
    std::uint64_t length = 0;
    if (saved.size < 8 || !manifest_.opened()->read_range(name, 0, 8, file.head.data())) throw whole_file_problem(name);
    std::memcpy(&length, file.head.data(), sizeof length);
    if (length > saved.size - 8) throw whole_file_problem(name);
    file.head.resize(8 + length);
    if (!manifest_.opened()->read_range(name, 8, length, file.head.data() + 8)) throw whole_file_problem(name);
    std::vector<std::pair<std::string, safetensors::detail::header_parser::entry>> entries;
    std::map<std::string, std::string> metadata;
    try {
      safetensors::detail::header_parser(file.head.substr(8), (directory_ / name).string()).parse(entries, metadata);
    } catch (const checkpoint_error&) {
      throw whole_file_problem(name, true);
    }
    file.data_begin = 8 + length;
    for (auto& [tensor, entry] : entries) {
      file.order.push_back(tensor);
      file.entries.emplace(tensor, std::move(entry));
    }
    files_.push_back(std::move(file));
    return files_.size() - 1;
  }
  [[nodiscard]] const opened& file(std::size_t f) const { return files_.at(f); }

  /// Tensor `tensor`'s entry in file `f`, checked: a dtype accel reads, `elements` of it (when not negative), its
  /// bytes within the file's data. Returns its type and the offset of its first byte in the file.
  std::pair<at::ScalarType, std::uint64_t> locate(std::size_t f, const std::string& tensor, std::int64_t elements) {
    const auto& file = files_.at(f);
    const auto where = (directory_ / file.name).string();
    const auto found = file.entries.find(tensor);
    if (found == file.entries.end())
      throw damaged_or(f, "accel::load_state: " + where + " lacks " + tensor + " (a damaged checkpoint?)");
    const auto& e = found->second;
    const auto type = safetensors::detail::scalar_type_of(e.dtype);
    if (!type) throw damaged_or(f, "accel::load_state: " + where + ": " + tensor + " has the unknown dtype " + e.dtype);
    const auto element = static_cast<std::int64_t>(c10::elementSize(*type));
    const auto count = elements < 0 ? c10::multiply_integers(e.shape) : elements;
    if (e.offsets.size() != 2 || e.offsets[0] < 0 || e.offsets[1] - e.offsets[0] != count * element ||
        static_cast<std::uint64_t>(e.offsets[1]) > file.size - file.data_begin)
      throw damaged_or(f, "accel::load_state: " + where + " holds " + tensor +
                              " in another size than its header or the layout gives, or outside its data "
                              "(a damaged checkpoint?)");
    return {*type, file.data_begin + static_cast<std::uint64_t>(e.offsets[0])};
  }

  /// Where the bytes of `part` of a tensor of `shape` and `type` whose elements lie in `pieces` are: only the
  /// overlapping bytes of each piece, checked to cover it. Nothing is read yet (`read_into`).
  planned_read plan(const std::vector<piece>& pieces, at::ScalarType type, const std::vector<std::int64_t>& shape,
                    held_part part, const std::string& what) {
    auto planned = plan_ranges(pieces, type, shape, part, what);
    for (const auto& r : planned.ranges)
      spans_.push_back({.file = r.file, .offset = r.offset, .at = nullptr, .bytes = r.bytes, .owner = {}});
    return planned;
  }
  /// The same read now, into a new tensor in its shape (whole) or flat (a slice).
  at::Tensor read(const std::vector<piece>& pieces, at::ScalarType type, const std::vector<std::int64_t>& shape,
                  held_part part, const std::string& what) {
    const auto planned = plan_ranges(pieces, type, shape, part, what);
    auto out = at::empty(planned.shape, at::TensorOptions().dtype(type));
    read_ranges(planned, out);
    for (const auto& r : planned.ranges)
      spans_.push_back({.file = r.file,
                        .offset = r.offset,
                        .at = static_cast<const char*>(out.data_ptr()) + r.at,
                        .bytes = r.bytes,
                        .owner = out});
    return out;
  }
  /// Reads `planned` into `destination` in place: straight into its storage where it is a contiguous CPU tensor of
  /// the type and size read (a parameter at rest), else through a new tensor copied in (a parameter on a GPU).
  void read_into(const planned_read& planned, const at::Tensor& destination) const {
    if (destination.device().is_cpu() && destination.is_contiguous() && destination.scalar_type() == planned.type &&
        destination.numel() == c10::multiply_integers(planned.shape)) {
      read_ranges(planned, destination);
      destination.unsafeGetTensorImpl()->bump_version();  // written in place, as copy_ would have
      return;
    }
    auto staged = at::empty(planned.shape, at::TensorOptions().dtype(planned.type));
    read_ranges(planned, staged);
    destination.copy_(staged.view(destination.sizes()));
  }

  /// `problem`, unless file `f` is damaged (checked whole against its CRC-32C, which then throws): a header that
  /// parses but says something else than was saved is called damaged, as a file read whole would be.
  [[nodiscard]] checkpoint_error damaged_or(std::size_t f, const std::string& problem) const {
    if (checksums_) check_checkpoint_file(directory_, files_.at(f).name, manifest_);
    return checkpoint_error(problem);
  }
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
  void check_whole_files() const {
    for (std::size_t f = 0; checksums_ && f < files_.size(); ++f) {
      std::vector<const read_span*> spans;
      for (const auto& span : spans_)
        if (span.file == f) spans.push_back(&span);
      std::sort(spans.begin(), spans.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
      const auto& file = files_[f];
      std::vector<const read_span*> chain;  // from the header on, without a gap
      std::uint64_t next = file.head.size();
      for (const auto* span : spans)
        if (span->offset == next) {
          chain.push_back(span);
          next += span->bytes;
        }
      if (next == file.size)
        check_as_saved(directory_ / file.name, listed_file(directory_, file.name, manifest_), file.size,
                       checksum_of(file, chain));
    }
  }

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
  [[nodiscard]] std::uint32_t checksum_of(const opened& file, const std::vector<const read_span*>& chain) const {
    auto crc = crc32c(file.head);
    for (const auto* span : chain) {
      if (span->at != nullptr) {
        crc = crc32c_extend(crc, std::string_view(span->at, span->bytes));
        continue;
      }
      const auto extended = manifest_.opened()->checksum_range(file.name, span->offset, span->bytes, crc);
      if (!extended)
        throw checkpoint_error("accel::load_state: cannot check " + (directory_ / file.name).string() +
                               " (truncated since its manifest was read?)");
      crc = *extended;
    }
    return crc;
  }
  planned_read plan_ranges(const std::vector<piece>& pieces, at::ScalarType type,
                           const std::vector<std::int64_t>& shape, held_part part, const std::string& what) const {
    if (part.whole) part = held_part::all_of(c10::multiply_integers(shape));
    planned_read planned{
        .ranges = {}, .type = type, .shape = part.whole ? shape : std::vector<std::int64_t>{part.length}, .what = what};
    const auto element = static_cast<std::int64_t>(c10::elementSize(type));
    std::int64_t covered = 0;
    for (const auto& p : pieces) {
      const auto lo = std::max(p.begin, part.begin), hi = std::min(p.begin + p.length, part.begin + part.length);
      if (lo >= hi) continue;
      planned.ranges.push_back({.file = p.file,
                                .offset = p.offset + static_cast<std::uint64_t>((lo - p.begin) * element),
                                .bytes = static_cast<std::uint64_t>((hi - lo) * element),
                                .at = static_cast<std::uint64_t>((lo - part.begin) * element)});
      covered += hi - lo;
    }
    if (covered != part.length)
      throw checkpoint_error("accel::load_state: the checkpoint's files hold " + std::to_string(covered) + " of the " +
                             std::to_string(part.length) + " elements of " + what +
                             " this process loads (a damaged checkpoint?)");
    return planned;
  }
  void read_ranges(const planned_read& planned, const at::Tensor& into) const {
    auto* base = static_cast<char*>(into.data_ptr());
    for (const auto& r : planned.ranges) {
      const auto& file = files_.at(r.file);
      if (!manifest_.opened()->read_range(file.name, r.offset, r.bytes, base + r.at))
        throw checkpoint_error("accel::load_state: cannot read " + planned.what + " from " +
                               (directory_ / file.name).string() + " (truncated since its manifest was read?)");
    }
  }

  /// A file whose length or header cannot be read: checked whole, so that a damaged file is called damaged (its
  /// checksum), and otherwise refused as truncated or corrupt.
  checkpoint_error whole_file_problem(const std::string& name, bool header = false) const {
    if (checksums_) check_checkpoint_file(directory_, name, manifest_);
    return checkpoint_error("accel::load_state: " + (directory_ / name).string() + " is truncated or corrupt: " +
                            (header ? "its header does not parse" : "its header length lies outside the file"));
  }

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
inline held_weights read_held_shards(ranged_reader& reader, const shard_layout_table& table, std::size_t index,
                                     const held_parts& parts, const torch::nn::Module& model, const std::string& what) {
  const auto& layout = table.models.at(index);
  const auto file_of = [index](int r) { return checkpoint_files::shard(checkpoint_files::kind::model, index, r); };
  const auto first = reader.open(file_of(0));
  std::vector<std::pair<at::ScalarType, std::uint64_t>> located;
  std::map<std::string, at::Tensor> described;  // on the meta device: names, shapes and dtypes, no data
  for (std::size_t t = 0; t < layout.names.size(); ++t) {
    const auto numel = c10::multiply_integers(layout.shapes[t]);
    located.push_back(
        reader.locate(first, layout.names[t],
                      layout.sharded[t] ? shard_span_of(numel, 0, static_cast<int>(table.processes)).length : numel));
    described[layout.names[t]] =
        at::empty(layout.shapes[t], at::TensorOptions().dtype(located.back().first).device(at::kMeta));
  }
  reader.check_fit([&] { check_weights_fit(whole_state_of(model, index, parts), described, what); });
  held_weights held;
  for (std::size_t t = 0; t < layout.names.size(); ++t) {
    const auto& name = layout.names[t];
    const auto numel = c10::multiply_integers(layout.shapes[t]);
    const auto part = parts.weight(index, name);
    const auto pieces = layout.sharded[t]
                            ? spread_pieces(reader, file_of, table.processes, name, numel, part, located[t].first)
                            : std::vector<ranged_reader::piece>{
                                  {.file = first, .begin = 0, .length = numel, .offset = located[t].second}};
    held.reads[name] = reader.plan(pieces, located[t].first, layout.shapes[t], part, name);
    if (!part.whole) held.sliced.insert(name);
  }
  return held;
}

/// Where model `index`'s tensors in the safetensors files `files` (a full checkpoint's `model.safetensors`, or
/// Hugging Face's sharded files) as this process holds them lie: each tensor's byte range, or the range of this
/// process's slice of it; checked against `model` (names, shapes, dtypes).
inline held_weights read_held_files(ranged_reader& reader, const std::vector<std::size_t>& files, std::size_t index,
                                    const held_parts& parts, const torch::nn::Module& model, const std::string& what) {
  struct where {
    std::size_t file;
    at::ScalarType type;
    std::uint64_t offset;
  };
  std::map<std::string, at::Tensor> described;
  std::map<std::string, where> located;
  for (const auto f : files)
    for (const auto& name : reader.file(f).order) {
      const auto [type, offset] = reader.locate(f, name, -1);
      located[name] = {f, type, offset};
      described[name] =
          at::empty(reader.file(f).entries.at(name).shape, at::TensorOptions().dtype(type).device(at::kMeta));
    }
  reader.check_fit([&] { check_weights_fit(whole_state_of(model, index, parts), described, what); });
  held_weights held;
  for (const auto& [name, spot] : located) {
    const auto& shape = reader.file(spot.file).entries.at(name).shape;
    const auto part = parts.weight(index, name);
    const ranged_reader::piece whole{
        .file = spot.file, .begin = 0, .length = c10::multiply_integers(shape), .offset = spot.offset};
    held.reads[name] = reader.plan({whole}, spot.type, shape, part, name);
    if (!part.whole) held.sliced.insert(name);
  }
  return held;
}

/// Optimizer `index`'s state of a sharded-format checkpoint as this process holds it: each field by its name
/// (`state_field_name`), this process's slice (flat) of a parameter `parts` lists, else the whole tensor shaped as
/// its parameter; steps as 0-d tensors.
inline std::map<std::string, at::Tensor> read_held_optimizer_state(ranged_reader& reader,
                                                                   const shard_layout_table& table, std::size_t index,
                                                                   const held_parts& parts) {
  std::map<std::string, std::pair<std::vector<std::int64_t>, bool>> parameters;  // by state_field_name(..., "")
  for (std::size_t m = 0; m < table.models.size(); ++m)
    for (std::size_t t = 0; t < table.models[m].names.size(); ++t)
      parameters[state_field_name(m, table.models[m].names[t], "")] = {table.models[m].shapes[t],
                                                                       table.models[m].sharded[t]};
  const auto file_of = [index](int r) { return checkpoint_files::shard(checkpoint_files::kind::optimizer, index, r); };
  const auto first = reader.open(file_of(0));
  std::map<std::string, at::Tensor> state;
  for (const auto& name : reader.file(first).order) {
    const auto slash = name.rfind('/');
    const auto prefix = slash == std::string::npos ? std::string() : name.substr(0, slash + 1);
    const auto parameter = parameters.find(prefix);
    if (slash == std::string::npos || parameter == parameters.end())
      throw reader.damaged_or(first, "accel::load_state: " + reader.file(first).name + " holds " + name +
                                         ", the state of no parameter of the layout (a damaged checkpoint?)");
    const auto& [shape, sharded] = parameter->second;
    const auto& stored_shape = reader.file(first).entries.at(name).shape;
    if (stored_shape.empty() || !sharded) {  // a step count, the same everywhere, or a full state tensor
      const auto [type, offset] = reader.locate(first, name, -1);
      const auto numel = c10::multiply_integers(stored_shape);
      state[name] = reader.read({{.file = first, .begin = 0, .length = numel, .offset = offset}}, type, stored_shape,
                                stored_shape.empty() ? held_part{} : parts.state(prefix), name);
      continue;
    }
    const auto numel = c10::multiply_integers(shape);
    const auto type =
        reader.locate(first, name, shard_span_of(numel, 0, static_cast<int>(table.processes)).length).first;
    const auto part = parts.state(prefix);
    state[name] =
        reader.read(spread_pieces(reader, file_of, table.processes, name, numel, part, type), type, shape, part, name);
  }
  return state;
}

/// Reads `reads` (a held_weights', checked) into `module`'s parameters and buffers, straight into their storage:
/// those `sliced` names into the parameter at rest, which is then this process's slice only (`with_weights_to_load`).
/// Everything was checked before; should a read still fail (an I/O error), the weights read before it stay.
inline void read_held_weights(const ranged_reader& reader, torch::nn::Module& module,
                              const std::map<std::string, planned_read>& reads, const std::set<std::string>& sliced) {
  at::NoGradGuard no_grad;
  try {
    for (auto& [name, tensor] : state_of(module))
      reader.read_into(reads.at(name), sliced.contains(name) ? tensor.view({-1}) : tensor);
  } catch (const checkpoint_error& e) {
    throw checkpoint_error(std::string(e.what()) + "; the model's weights are now partly loaded: load them again");
  }
}

/// Copies `tensors` (read whole and checked) into `module`'s parameters and buffers, in place: those `sliced` names
/// into the parameter at rest (keep_held_slices).
inline void copy_held_weights(torch::nn::Module& module, const std::map<std::string, at::Tensor>& tensors,
                              const std::set<std::string>& sliced) {
  at::NoGradGuard no_grad;
  for (auto& [name, tensor] : state_of(module)) {
    const auto& piece = tensors.at(name);
    if (sliced.contains(name))
      tensor.view({-1}).copy_(piece.view({-1}));
    else
      tensor.copy_(piece);
  }
}

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
inline checkpoint_manifest plain_files(const std::filesystem::path& directory, const std::vector<std::string>& names) {
  checkpoint_manifest manifest;
  auto opened_now = std::make_shared<opened_files>();
  for (const auto& name : names) {
    const auto path = directory / name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    std::error_code error;
    const auto size = std::filesystem::file_size(path, error);
    if (fd < 0 || error) {
      if (fd >= 0) ::close(fd);
      throw checkpoint_error("accel::load_model: cannot open " + path.string() + " (missing file?)");
    }
    opened_now->add(name, fd);
    manifest.add({.name = name, .size = size, .crc32c = 0});
  }
  manifest.keep_open(std::move(opened_now));
  return manifest;
}

/// The directory and the safetensors files of `where`: a `.safetensors` file, or a directory holding Hugging Face's
/// `model.safetensors.index.json` (the files its weight map names) or `model.safetensors`.
inline std::pair<std::filesystem::path, std::vector<std::string>> model_files_of(const std::filesystem::path& where) {
  if (!std::filesystem::is_directory(where)) return {where.parent_path(), {where.filename().string()}};
  const auto index = where / "model.safetensors.index.json";
  if (!std::filesystem::exists(index)) return {where, {"model.safetensors"}};
  std::set<std::string> files;
  for (const auto& [tensor, file] : read_weight_map(index)) files.insert(file);
  return {where, std::vector<std::string>(files.begin(), files.end())};
}

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
