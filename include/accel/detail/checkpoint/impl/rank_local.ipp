/// \file
/// What rank_local.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../rank_local.hpp"

namespace accel::detail {

held_part held_part::all_of(std::int64_t numel) {
  held_part part;
  part.length = numel;
  return part;
}

held_part held_parts::weight(std::size_t model, const std::string& name) const {
  if (model >= weights.size()) return {};
  const auto found = weights[model].find(name);
  return found == weights[model].end() ? held_part{} : found->second;
}

held_part held_parts::state(const std::string& parameter) const {
  const auto found = states.find(parameter);
  return found == states.end() ? held_part{} : found->second;
}

safetensors::tensor_list whole_state_of(const torch::nn::Module& model, std::size_t index, const held_parts& parts) {
  auto state = state_of(model);
  for (auto& [name, tensor] : state)
    if (const auto part = parts.weight(index, name); !part.whole)
      tensor = at::empty(part.sizes, tensor.options().device(at::kMeta));
  return state;
}

std::set<std::string> keep_held_slices(std::map<std::string, at::Tensor>& tensors, std::size_t index,
                                       const held_parts& parts) {
  std::set<std::string> sliced;
  for (auto& [name, tensor] : tensors)
    if (const auto part = parts.weight(index, name); !part.whole) {
      tensor = tensor.reshape({-1}).narrow(0, part.begin, part.length).clone();
      sliced.insert(name);
    }
  return sliced;
}

std::size_t ranged_reader::open(const std::string& name) {
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
  if (length > saved.size - 8 || length > safetensors::detail::max_header_bytes) throw whole_file_problem(name);
  file.head.resize(8 + length);
  if (!manifest_.opened()->read_range(name, 8, length, file.head.data() + 8)) throw whole_file_problem(name);
  std::vector<std::pair<std::string, safetensors::detail::header_parser::entry>> entries;
  std::map<std::string, std::string> metadata;
  try {
    safetensors::detail::header_parser(file.head.substr(8), (directory_ / name).string()).parse(entries, metadata);
    safetensors::detail::check_ranges(entries, saved.size - 8 - length, (directory_ / name).string());
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

std::pair<at::ScalarType, std::uint64_t> ranged_reader::locate(std::size_t f, const std::string& tensor,
                                                               std::int64_t elements) {
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

planned_read ranged_reader::plan(const std::vector<piece>& pieces, at::ScalarType type,
                                 const std::vector<std::int64_t>& shape, held_part part, const std::string& what) {
  auto planned = plan_ranges(pieces, type, shape, part, what);
  for (const auto& r : planned.ranges)
    spans_.push_back({.file = r.file, .offset = r.offset, .at = nullptr, .bytes = r.bytes, .owner = {}});
  return planned;
}

at::Tensor ranged_reader::read(const std::vector<piece>& pieces, at::ScalarType type,
                               const std::vector<std::int64_t>& shape, held_part part, const std::string& what) {
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

void ranged_reader::read_into(const planned_read& planned, const at::Tensor& destination) const {
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

checkpoint_error ranged_reader::damaged_or(std::size_t f, const std::string& problem) const {
  if (checksums_) check_checkpoint_file(directory_, files_.at(f).name, manifest_);
  return checkpoint_error(problem);
}

void ranged_reader::check_whole_files() const {
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

std::uint32_t ranged_reader::checksum_of(const opened& file, const std::vector<const read_span*>& chain) const {
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

planned_read ranged_reader::plan_ranges(const std::vector<piece>& pieces, at::ScalarType type,
                                        const std::vector<std::int64_t>& shape, held_part part,
                                        const std::string& what) const {
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

void ranged_reader::read_ranges(const planned_read& planned, const at::Tensor& into) const {
  auto* base = static_cast<char*>(into.data_ptr());
  for (const auto& r : planned.ranges) {
    const auto& file = files_.at(r.file);
    if (!manifest_.opened()->read_range(file.name, r.offset, r.bytes, base + r.at))
      throw checkpoint_error("accel::load_state: cannot read " + planned.what + " from " +
                             (directory_ / file.name).string() + " (truncated since its manifest was read?)");
  }
}

checkpoint_error ranged_reader::whole_file_problem(const std::string& name, bool header) const {
  if (checksums_) check_checkpoint_file(directory_, name, manifest_);
  return checkpoint_error("accel::load_state: " + (directory_ / name).string() + " is truncated or corrupt: " +
                          (header ? "its header does not parse" : "its header length lies outside the file"));
}

held_weights read_held_shards(ranged_reader& reader, const shard_layout_table& table, std::size_t index,
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

held_weights read_held_files(ranged_reader& reader, const std::vector<std::size_t>& files, std::size_t index,
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

std::map<std::string, at::Tensor> read_held_optimizer_state(ranged_reader& reader, const shard_layout_table& table,
                                                            std::size_t index, const held_parts& parts) {
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

void read_held_weights(const ranged_reader& reader, torch::nn::Module& module,
                       const std::map<std::string, planned_read>& reads, const std::set<std::string>& sliced) {
  at::NoGradGuard no_grad;
  try {
    for (auto& [name, tensor] : state_of(module))
      reader.read_into(reads.at(name), sliced.contains(name) ? tensor.view({-1}) : tensor);
  } catch (const checkpoint_error& e) {
    throw checkpoint_error(std::string(e.what()) + "; the model's weights are now partly loaded: load them again");
  }
}

void copy_held_weights(torch::nn::Module& module, const std::map<std::string, at::Tensor>& tensors,
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

checkpoint_manifest plain_files(const std::filesystem::path& directory, const std::vector<std::string>& names) {
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

std::pair<std::filesystem::path, std::vector<std::string>> model_files_of(const std::filesystem::path& where) {
  if (!std::filesystem::is_directory(where)) return {where.parent_path(), {where.filename().string()}};
  const auto index = where / "model.safetensors.index.json";
  if (!std::filesystem::exists(index)) return {where, {"model.safetensors"}};
  std::set<std::string> files;
  for (const auto& [tensor, file] : safetensors::detail::read_weight_map(index)) files.insert(file);
  return {where, std::vector<std::string>(files.begin(), files.end())};
}

}  // namespace accel::detail
