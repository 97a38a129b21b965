/// \file
/// What profile_events.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../profile_events.hpp"

namespace accel::detail {

bool contains(const profile_event& outer, const profile_event& inner) noexcept {
  return outer.start_ns <= inner.start_ns && inner.start_ns + inner.duration_ns <= outer.start_ns + outer.duration_ns;
}

std::vector<event_totals> nested_totals(const std::vector<profile_event>& events) {
  std::vector<std::size_t> order(events.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::ranges::stable_sort(order, [&](std::size_t a, std::size_t b) {  // an outer event before what starts with it
    return std::tuple(events[a].thread, events[a].start_ns, -events[a].duration_ns) <
           std::tuple(events[b].thread, events[b].start_ns, -events[b].duration_ns);
  });
  std::vector<event_totals> totals(events.size());
  std::vector<std::int64_t> children_end(events.size(), std::numeric_limits<std::int64_t>::min());
  std::vector<std::size_t> open;
  for (const std::size_t i : order) {
    const auto& event = events[i];
    while (!open.empty() && (events[open.back()].thread != event.thread || !contains(events[open.back()], event)))
      open.pop_back();
    if (is_memory_event(event)) {
      for (const std::size_t outer : open) totals[outer].memory += event.bytes;
      for (std::size_t k = 0; k + 1 < open.size(); ++k) totals[open[k]].children_memory += event.bytes;
      continue;
    }
    if (!open.empty()) {
      const std::int64_t end = event.start_ns + event.duration_ns;
      auto& covered = children_end[open.back()];
      totals[open.back()].children_ns += std::max<std::int64_t>(0, end - std::max(event.start_ns, covered));
      covered = std::max(covered, end);
    }
    open.push_back(i);
  }
  return totals;
}

std::string profile_time(std::int64_t nanoseconds) {
  const double us = static_cast<double>(nanoseconds) / 1000.0;
  char text[32];
  if (us >= 1e6)
    std::snprintf(text, sizeof text, "%.3fs", us / 1e6);
  else if (us >= 1e3)
    std::snprintf(text, sizeof text, "%.3fms", us / 1e3);
  else
    std::snprintf(text, sizeof text, "%.3fus", us);
  return text;
}

std::string profile_memory(std::int64_t bytes) {
  constexpr double kb = 1024.0, mb = kb * 1024.0, gb = mb * 1024.0;
  const double value = static_cast<double>(bytes), size = value < 0 ? -value : value;
  char text[32];
  if (size >= gb)
    std::snprintf(text, sizeof text, "%.2f Gb", value / gb);
  else if (size >= mb)
    std::snprintf(text, sizeof text, "%.2f Mb", value / mb);
  else if (size >= kb)
    std::snprintf(text, sizeof text, "%.2f Kb", value / kb);
  else
    std::snprintf(text, sizeof text, "%lld b", static_cast<long long>(bytes));
  return text;
}

std::string profile_percent(std::int64_t part, std::int64_t whole) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f%%", whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / whole);
  return text;
}

std::string profile_shapes(const std::vector<std::vector<std::int64_t>>& shapes) {
  std::string text = "[";
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    text += i == 0 ? "[" : ", [";
    for (std::size_t k = 0; k < shapes[i].size(); ++k) text += (k == 0 ? "" : ", ") + std::to_string(shapes[i][k]);
    text += "]";
  }
  return text + "]";
}

double profile_sort_value(const profile_event_average& row, std::string_view sort_by) {
  if (sort_by == "cpu_time_total") return static_cast<double>(row.cpu_time_total_ns);
  if (sort_by == "self_cpu_time_total") return static_cast<double>(row.self_cpu_time_total_ns);
  if (sort_by == "cpu_time") return static_cast<double>(row.cpu_time_ns());
  if (sort_by == "count") return static_cast<double>(row.count);
  if (sort_by == "cpu_memory_usage") return static_cast<double>(row.cpu_memory_usage);
  if (sort_by == "self_cpu_memory_usage") return static_cast<double>(row.self_cpu_memory_usage);
  if (sort_by == "flops") return static_cast<double>(row.flops);
  throw std::invalid_argument("accel::profile_averages::table: sort_by \"" + std::string(sort_by) +
                              "\" is not one of \"\", cpu_time_total, self_cpu_time_total, cpu_time, count, "
                              "cpu_memory_usage, self_cpu_memory_usage, flops");
}

std::string profile_table_text(const std::vector<std::vector<std::string>>& cells, std::string_view footer) {
  std::vector<std::size_t> widths(cells.front().size(), 0);
  for (const auto& row : cells)
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  std::string rule, text;
  for (std::size_t c = 0; c < widths.size(); ++c) rule += (c == 0 ? "" : "  ") + std::string(widths[c], '-');
  rule += "\n";
  const auto line = [&](const std::vector<std::string>& row) {
    for (std::size_t c = 0; c < row.size(); ++c)
      text += (c == 0 ? "" : "  ") + std::string(widths[c] - row[c].size(), ' ') + row[c];
    text += "\n";
  };
  text += rule;
  line(cells.front());
  text += rule;
  std::for_each(cells.begin() + 1, cells.end(), line);
  text += rule;
  return text + std::string(footer) + "\n";
}
}  // namespace accel::detail

namespace accel {

profile_averages key_averages_function::operator()(const std::vector<profile_event>& events,
                                                   bool group_by_input_shape) const {
  const auto totals = detail::nested_totals(events);
  std::vector<profile_event_average> rows;
  std::map<std::pair<std::string, std::vector<std::vector<std::int64_t>>>, std::size_t> row_of;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto& event = events[i];
    if (detail::is_memory_event(event)) continue;
    auto key = std::pair(event.name, group_by_input_shape ? event.input_shapes : decltype(event.input_shapes){});
    const auto [found, added] = row_of.try_emplace(key, rows.size());
    if (added) rows.push_back({.key = event.name, .input_shapes = key.second});
    auto& row = rows[found->second];
    ++row.count;
    row.cpu_time_total_ns += event.duration_ns;
    row.self_cpu_time_total_ns += event.duration_ns - totals[i].children_ns;
    row.cpu_memory_usage += totals[i].memory;
    row.self_cpu_memory_usage += totals[i].memory - totals[i].children_memory;
    row.flops += event.flops;
  }
  return profile_averages(std::move(rows), group_by_input_shape);
}

const profile_event_average& profile_averages::at(std::string_view key) const {
  const auto found = std::ranges::find(rows_, key, &profile_event_average::key);
  if (found == rows_.end())
    throw std::out_of_range("accel::profile_averages: no event named \"" + std::string(key) + "\" was recorded");
  return *found;
}

std::string profile_averages::table(std::string_view sort_by, int row_limit) const {
  std::vector<const profile_event_average*> shown;
  for (const auto& row : rows_) shown.push_back(&row);
  if (!sort_by.empty())
    std::ranges::stable_sort(shown, [&](const auto* a, const auto* b) {
      return detail::profile_sort_value(*a, sort_by) > detail::profile_sort_value(*b, sort_by);
    });
  if (row_limit >= 0 && shown.size() > static_cast<std::size_t>(row_limit)) shown.resize(row_limit);
  const bool memory = std::ranges::any_of(rows_, [](const auto& r) { return r.cpu_memory_usage != 0; });
  const bool flops = std::ranges::any_of(rows_, [](const auto& r) { return r.flops != 0; });
  std::int64_t self_total = 0;  // over every row, shown or not, as torch.profiler
  for (const auto& row : rows_) self_total += row.self_cpu_time_total_ns;
  std::vector<std::vector<std::string>> cells{
      {"Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"}};
  if (memory) cells[0].insert(cells[0].end(), {"CPU Mem", "Self CPU Mem"});
  cells[0].push_back("# of Calls");
  if (by_input_shape_) cells[0].push_back("Input Shapes");
  if (flops) cells[0].push_back("Total MFLOPs");
  for (const auto* row : shown) {
    constexpr std::size_t widest_name = 55;  // torch.profiler's: longer names are cut, with "..."
    const auto name = row->key.size() <= widest_name ? row->key : row->key.substr(0, widest_name - 3) + "...";
    std::vector<std::string> line{name,
                                  detail::profile_percent(row->self_cpu_time_total_ns, self_total),
                                  detail::profile_time(row->self_cpu_time_total_ns),
                                  detail::profile_percent(row->cpu_time_total_ns, self_total),
                                  detail::profile_time(row->cpu_time_total_ns),
                                  detail::profile_time(row->cpu_time_ns())};
    if (memory)
      line.insert(line.end(),
                  {detail::profile_memory(row->cpu_memory_usage), detail::profile_memory(row->self_cpu_memory_usage)});
    line.push_back(std::to_string(row->count));
    if (by_input_shape_) line.push_back(detail::profile_shapes(row->input_shapes));
    if (flops) {
      char mflops[32];
      std::snprintf(mflops, sizeof mflops, "%.3f", static_cast<double>(row->flops) / 1e6);
      line.push_back(mflops);
    }
    cells.push_back(std::move(line));
  }
  return detail::profile_table_text(cells, "Self CPU time total: " + detail::profile_time(self_total));
}

}  // namespace accel
