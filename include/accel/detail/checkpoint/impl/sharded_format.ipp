/// \file
/// What sharded_format.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../sharded_format.hpp"

namespace accel::detail {

void model_layout::write(torch::serialize::OutputArchive& archive) const {
  std::vector<std::int64_t> dims, sizes, flags;
  for (std::size_t t = 0; t < names.size(); ++t) {
    dims.push_back(static_cast<std::int64_t>(shapes[t].size()));
    sizes.insert(sizes.end(), shapes[t].begin(), shapes[t].end());
    flags.push_back(sharded[t] ? 1 : 0);
  }
  archive.write("names", c10::IValue(names));
  archive.write("dims", c10::IValue(dims));
  archive.write("sizes", c10::IValue(sizes));
  archive.write("sharded", c10::IValue(flags));
}

model_layout model_layout::read(torch::serialize::InputArchive& archive, const std::string& where) {
  c10::IValue names, dims, sizes, flags;
  if (!archive.try_read("names", names) || !archive.try_read("dims", dims) || !archive.try_read("sizes", sizes) ||
      !archive.try_read("sharded", flags) || !names.isList() || !dims.isIntList() || !sizes.isIntList() ||
      !flags.isIntList())
    throw checkpoint_error("accel: " + where + " lacks a model's names, shapes or sharding (a damaged file?)");
  model_layout layout;
  for (const auto& name : names.toListRef()) layout.names.push_back(name.toStringRef());
  const auto dim_list = dims.toIntVector(), size_list = sizes.toIntVector(), flag_list = flags.toIntVector();
  if (dim_list.size() != layout.names.size() || flag_list.size() != layout.names.size())
    throw checkpoint_error("accel: " + where + " describes a model inconsistently (a damaged file?)");
  std::size_t next = 0;
  for (std::size_t t = 0; t < layout.names.size(); ++t) {
    if (dim_list[t] < 0 || next + static_cast<std::size_t>(dim_list[t]) > size_list.size())
      throw checkpoint_error("accel: " + where + " describes a model inconsistently (a damaged file?)");
    layout.shapes.emplace_back(size_list.begin() + static_cast<std::ptrdiff_t>(next),
                               size_list.begin() + static_cast<std::ptrdiff_t>(next + dim_list[t]));
    next += static_cast<std::size_t>(dim_list[t]);
    layout.sharded.push_back(flag_list[t] != 0);
  }
  return layout;
}

written_file shard_layout_table::save(const std::filesystem::path& directory) const {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(std::string("accel sharded checkpoint 1")));
  archive.write("processes", c10::IValue(processes));
  archive.write("models", c10::IValue(static_cast<std::int64_t>(models.size())));
  for (std::size_t i = 0; i < models.size(); ++i) {
    torch::serialize::OutputArchive model;
    models[i].write(model);
    archive.write("model_" + std::to_string(i), model);
  }
  const auto bytes = serialised(archive);
  return write_atomically<checkpoint_error>(directory / checkpoint_files::shard_layout,
                                            [&](auto& out) { out.write(bytes); });
}

std::optional<shard_layout_table> shard_layout_table::load(const std::filesystem::path& directory,
                                                           const std::optional<checkpoint_manifest>& manifest) {
  if (!std::filesystem::exists(directory / checkpoint_files::shard_layout)) return std::nullopt;
  if (!manifest) throw sharded_without_manifest(directory);
  const auto bytes = read_checkpoint_file(directory, std::string(checkpoint_files::shard_layout), manifest);
  const auto where = (directory / checkpoint_files::shard_layout).string();
  torch::serialize::InputArchive archive;
  c10::IValue processes, models;
  try {
    archive.load_from(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    throw checkpoint_error("accel: " + where + " is truncated or corrupt: " + first_line(e.what()));
  }
  if (!archive.try_read("processes", processes) || !processes.isInt() || processes.toInt() < 1 ||
      !archive.try_read("models", models) || !models.isInt() || models.toInt() < 0)
    throw checkpoint_error("accel: " + where + " lacks the number of processes or of models (a damaged file?)");
  shard_layout_table table;
  table.processes = processes.toInt();
  for (std::int64_t i = 0; i < models.toInt(); ++i) {
    torch::serialize::InputArchive model;
    if (!archive.try_read("model_" + std::to_string(i), model))
      throw checkpoint_error("accel: " + where + " lacks model " + std::to_string(i) + "'s layout");
    table.models.push_back(model_layout::read(model, where));
  }
  return table;
}

std::string state_field_name(std::size_t model, const std::string& parameter, std::string_view field) {
  return checkpoint_files::numbered(checkpoint_files::kind::model, model, "")
      .append(".")
      .append(parameter)
      .append("/")
      .append(field);
}

safetensors::detail::file_header read_checkpoint_header(const std::filesystem::path& directory, const std::string& name,
                                                        const checkpoint_manifest& manifest) {
  const auto where = (directory / name).string();
  const auto size = manifest.files().at(name).size;
  std::uint64_t length = 0;
  if (size < 8 || !manifest.opened()->read_range(name, 0, sizeof length, &length))
    throw checkpoint_error("accel: " + where + " is truncated: shorter than the 8-byte header length");
  safetensors::detail::check_header_length(length, size, where);
  std::string text(length, '\0');
  if (!manifest.opened()->read_range(name, 8, length, text.data()))
    throw checkpoint_error("accel: cannot read the header of " + where);
  safetensors::detail::file_header header;
  safetensors::detail::header_parser(std::move(text), where).parse(header.entries, header.metadata);
  safetensors::detail::check_ranges(header.entries, size - 8 - length, where);
  header.data_begin = 8 + length;
  return header;
}

void ranged_file::read(const std::string& tensor, const std::string& dtype, std::int64_t bytes, void* into,
                       const std::filesystem::path& directory, const checkpoint_manifest& manifest) const {
  const auto found = entries.find(tensor);
  if (found == entries.end())
    throw checkpoint_error("accel: " + (directory / name).string() + " lacks " + tensor + " (a damaged checkpoint?)");
  const auto& offsets = found->second.offsets;
  if (found->second.dtype != dtype || offsets.size() != 2 || offsets[1] - offsets[0] != bytes ||
      !manifest.opened()->read_range(name, data_begin + static_cast<std::uint64_t>(offsets[0]),
                                     static_cast<std::uint64_t>(bytes), into))
    throw checkpoint_error("accel: " + (directory / name).string() + " holds " + tensor +
                           " in another type or size than the layout gives (a damaged checkpoint?)");
}

ranged_file open_ranged_file(const std::filesystem::path& directory, const std::string& name,
                             const checkpoint_manifest& manifest) {
  check_checkpoint_file(directory, name, manifest);
  auto header = read_checkpoint_header(directory, name, manifest);
  ranged_file file{.name = name, .data_begin = header.data_begin, .order = {}, .entries = {}};
  for (auto& [tensor, entry] : header.entries) {
    file.order.push_back(tensor);
    file.entries.emplace(tensor, std::move(entry));
  }
  return file;
}

std::vector<ranged_file> open_model_shards(const std::filesystem::path& directory, const checkpoint_manifest& manifest,
                                           const shard_layout_table& table, std::size_t index) {
  std::vector<ranged_file> files;
  for (int r = 0; r < table.processes; ++r)
    files.push_back(
        open_ranged_file(directory, checkpoint_files::shard(checkpoint_files::kind::model, index, r), manifest));
  return files;
}

safetensors::detail::stored_tensor stored_as_in(const ranged_file& file, const std::string& tensor,
                                                const std::vector<std::int64_t>& shape,
                                                const std::filesystem::path& directory) {
  const auto found = file.entries.find(tensor);
  const auto type =
      found == file.entries.end() ? std::nullopt : safetensors::detail::scalar_type_of(found->second.dtype);
  if (!type)
    throw checkpoint_error("accel::merge_weights: " + (directory / file.name).string() + " lacks " + tensor +
                           ", or holds it in a type accel does not read (a damaged checkpoint?)");
  return {tensor, found->second.dtype, shape,
          c10::multiply_integers(shape) * static_cast<std::int64_t>(c10::elementSize(*type))};
}

bool rewrite_full_model(const std::filesystem::path& directory, const checkpoint_manifest& manifest, std::size_t index,
                        const std::filesystem::path& out) {
  const auto name = checkpoint_files::model(index, true);
  if (!manifest.files().contains(name)) return false;
  const auto file = open_ranged_file(directory, name, manifest);
  std::vector<safetensors::detail::stored_tensor> stored;
  for (const auto& tensor : file.order)
    stored.push_back(stored_as_in(file, tensor, file.entries.at(tensor).shape, directory));
  safetensors::save_streamed(out, stored, [&](std::size_t t, auto& written) {
    auto buffer = at::empty({stored[t].bytes}, at::kByte);  // one tensor, counted by accel's CPU allocator
    file.read(stored[t].name, stored[t].dtype, stored[t].bytes, buffer.data_ptr(), directory, manifest);
    written.write(buffer.data_ptr(), static_cast<std::size_t>(stored[t].bytes));
  });
  return true;
}

void write_merged_model(const std::filesystem::path& directory, const checkpoint_manifest& manifest,
                        const shard_layout_table& table, std::size_t index, const std::filesystem::path& out) {
  const auto& layout = table.models.at(index);
  const auto files = open_model_shards(directory, manifest, table, index);
  std::vector<safetensors::detail::stored_tensor> stored;
  for (std::size_t t = 0; t < layout.names.size(); ++t)
    stored.push_back(stored_as_in(files.front(), layout.names[t], layout.shapes[t], directory));
  safetensors::save_streamed(out, stored, [&](std::size_t t, auto& file) {
    const auto element = stored[t].bytes / std::max<std::int64_t>(1, c10::multiply_integers(layout.shapes[t]));
    auto buffer = at::empty({stored[t].bytes}, at::kByte);  // counted by accel's CPU allocator, as any tensor
    auto* bytes = static_cast<char*>(buffer.data_ptr());
    if (!layout.sharded[t]) {
      files.front().read(stored[t].name, stored[t].dtype, stored[t].bytes, bytes, directory, manifest);
    } else {
      for (int r = 0; r < table.processes; ++r) {
        const auto span = shard_span_of(c10::multiply_integers(layout.shapes[t]), r, static_cast<int>(table.processes));
        files[static_cast<std::size_t>(r)].read(stored[t].name, stored[t].dtype, span.length * element,
                                                bytes + span.begin * element, directory, manifest);
      }
    }
    file.write(bytes, static_cast<std::size_t>(stored[t].bytes));
  });
}

}  // namespace accel::detail
