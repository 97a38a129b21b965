/// \file
/// What flight_trace.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../flight_trace.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <stdexcept>

#include "../../support/directory_entries.hpp"

// GCC 12 at -O3 takes a moved pickle_value's std::variant for a string that may be uninitialized (a false positive,
// as the tests' -O1 note in tests/CMakeLists.txt says), which -Werror would make an error in the accel tool's build.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace accel::detail {

namespace trace_internals {

/// A value of the subset as Python's repr writes lists of numbers and strings: "[[3, 4]]", "['Float']".
inline std::string text_of(const pickle_value& v) {
  if (v.is_int()) return std::to_string(std::get<std::int64_t>(v.value));
  if (v.is_string()) return "'" + std::get<std::string>(v.value) + "'";
  if (v.is_sequence()) {
    std::string text = "[";
    const auto& items = v.as_sequence("a list");
    for (std::size_t i = 0; i < items.size(); ++i) text += (i ? ", " : "") + text_of(items[i]);
    return text + "]";
  }
  return v.is_none() ? "None" : "?";
}

/// "[0, 1, 2]", pg_config's text of a group's ranks, as numbers.
inline std::vector<int> ranks_of(const std::string& text) {
  std::vector<int> ranks;
  std::string digits;
  for (char c : text + ",") {
    if (std::isdigit(static_cast<unsigned char>(c)) != 0) {
      digits += c;
    } else if (!digits.empty()) {
      ranks.push_back(std::stoi(digits));
      digits.clear();
    }
  }
  return ranks;
}

inline std::string issued_by(const pickle_value& entry) {
  if (const auto* label = entry.find("issued_by"); label != nullptr && label->is_string())
    return label->as_string("issued_by");
  if (const auto* frames = entry.find("frames"); frames != nullptr && frames->is_sequence())
    for (const auto& frame : frames->as_sequence("frames"))
      if (const auto* name = frame.find("name"); name != nullptr && name->is_string()) return name->as_string("name");
  return "";
}

inline std::string processes(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "process " : "processes ";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

using by_sequence = std::map<std::int64_t, const traced_collective*>;

/// "started", or "started on process 0, scheduled on process 2": the states at one sequence number.
inline std::string states(const std::map<int, const traced_collective*>& at) {
  std::map<std::string, std::vector<int>> by_state;
  for (const auto& [rank, c] : at) by_state[c->state].push_back(rank);
  if (by_state.size() == 1) return by_state.begin()->first;
  std::string text;
  for (const auto& [state, ranks] : by_state) text += (text.empty() ? "" : ", ") + state + " on " + processes(ranks);
  return text;
}

/// "process 1 called all_gather, the others all_reduce": who called what at one sequence number, by `field`.
template <class Field>
std::string who_called(const std::map<int, const traced_collective*>& at, Field field) {
  std::map<std::string, std::vector<int>> callers;
  for (const auto& [rank, c] : at) callers[field(*c)].push_back(rank);
  auto most = std::max_element(callers.begin(), callers.end(),
                               [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
  const bool majority = most->second.size() * 2 > at.size();
  std::string text;
  for (const auto& [value, ranks] : callers) {
    if (majority && value == most->first) continue;
    text += (text.empty() ? "" : ", ") + processes(ranks) + " called " + value;
  }
  if (majority) text += ", the others " + most->first;
  return text;
}

/// Each member's collective at sequence number `seq`, for the members that hold it.
inline std::map<int, const traced_collective*> holding(const std::map<int, by_sequence>& members, std::int64_t seq) {
  std::map<int, const traced_collective*> at;
  for (const auto& [rank, seqs] : members)
    if (auto found = seqs.find(seq); found != seqs.end()) at[rank] = found->second;
  return at;
}

/// "collective 17 (all_reduce) on group default: ", what a sentence about one collective begins with.
inline std::string collective_head(std::int64_t seq, const traced_collective& c, const std::string& group) {
  return "collective " + std::to_string(seq) + " (" + c.operation + ") on group " + group + ": ";
}

/// "; issued by backward", what it ends with.
inline std::string issued_phrase(const traced_collective& c) {
  return "; issued by " + (c.issued_by.empty() ? std::string("no accel call") : c.issued_by);
}

/// The first problem of `group` among `members` (each one's collectives by sequence), or ""; `last` is the newest
/// sequence number any of them holds. Only when `complete` (every member dumped) is a collective every one of them
/// joined but did not complete a problem.
inline std::string first_problem(const std::string& group, const std::map<int, by_sequence>& members, bool complete,
                                 std::int64_t& last) {
  std::int64_t start = 0;
  last = 0;
  for (const auto& [rank, seqs] : members) {
    if (seqs.empty()) continue;
    start = std::max(start, seqs.begin()->first);  // before it, some process's ring no longer holds the record
    last = std::max(last, seqs.rbegin()->first);
  }
  for (auto seq = start; seq <= last; ++seq) {
    const auto at = holding(members, seq);
    if (at.empty()) continue;
    std::vector<int> missing;
    for (const auto& [rank, seqs] : members)
      if (!at.contains(rank)) missing.push_back(rank);
    const auto& first = *at.begin()->second;
    const auto head = collective_head(seq, first, group);
    const auto issued = issued_phrase(first);
    if (!missing.empty()) return head + processes(missing) + " missing; state " + states(at) + issued;
    auto differs = [&](auto field) {
      return std::any_of(at.begin(), at.end(), [&](const auto& p) { return field(*p.second) != field(first); });
    };
    const auto sequence = " at sequence " + std::to_string(seq) + " on group " + group;
    if (differs([](const auto& c) { return c.operation; }))
      return "desynchronised: " + who_called(at, [](const auto& c) { return c.operation; }) + sequence;
    if (differs([](const auto& c) { return c.input_sizes; }))
      return "desynchronised: " +
             who_called(at, [](const auto& c) { return c.operation + " of sizes " + c.input_sizes; }) + sequence;
    if (differs([](const auto& c) { return c.input_dtypes; }))
      return "desynchronised: " +
             who_called(at, [](const auto& c) { return c.operation + " of dtypes " + c.input_dtypes; }) + sequence;
    if (seq == last && first.state != "completed" && complete)
      return head + "no process missing, state " + states(at) + " (stuck inside the backend, or dumped while it ran)" +
             issued;
  }
  return "";
}

/// Where the members that dumped agree: their oldest collective not completed, waiting for the processes that left
/// no record (`silent`: their process or machine is gone, or stopped), or "" when every collective completed.
inline std::string waiting_for_the_silent(const std::string& group, const std::map<int, by_sequence>& members,
                                          const std::vector<int>& silent) {
  std::int64_t pending = -1;
  for (const auto& [rank, seqs] : members)
    for (const auto& [seq, c] : seqs)
      if (c->state != "completed" && (pending < 0 || seq < pending)) pending = seq;
  if (pending < 0) return "";
  const auto at = holding(members, pending);
  const auto& first = *at.begin()->second;
  return collective_head(pending, first, group) + processes(silent) +
         " missing (no flight record: the process or its machine is gone, or stopped); state " + states(at) +
         issued_phrase(first);
}

}  // namespace trace_internals

process_trace read_process_trace(const std::string& bytes, const std::string& file, int rank) {
  process_trace trace;
  trace.rank = rank;
  trace.file = file;
  try {
    const auto dump = read_pickle(bytes, file);
    if (const auto* r = dump.find("rank"); r != nullptr && r->is_int())
      trace.rank = static_cast<int>(r->as_int("rank"));
    for (const auto& [name, config] : dump.at("pg_config").as_dict("pg_config"))
      trace.groups[name.as_string("a group's name")] =
          trace_internals::ranks_of(config.at("ranks").as_string("a group's ranks"));
    for (const auto& entry : dump.at("entries").as_sequence("entries")) {
      if (const auto* p2p = entry.find("is_p2p");
          p2p != nullptr && std::get_if<bool>(&p2p->value) && std::get<bool>(p2p->value))
        continue;
      const auto& group = entry.at("process_group").as_sequence("process_group");
      auto name = entry.at("profiling_name").as_string("profiling_name");
      trace.collectives[group.at(0).as_string("a group's name")].push_back(
          {.sequence = entry.at("collective_seq_id").as_int("collective_seq_id"),
           .operation = name.substr(name.find(':') + 1),
           .input_sizes = trace_internals::text_of(entry.at("input_sizes")),
           .input_dtypes = trace_internals::text_of(entry.at("input_dtypes")),
           .state = entry.at("state").as_string("state"),
           .issued_by = trace_internals::issued_by(entry)});
    }
  } catch (const std::exception& e) {
    throw std::invalid_argument("accel: " + file + " is not a flight record: " + e.what());
  }
  return trace;
}

std::vector<process_trace> read_trace_directory(const std::string& directory) {
  std::vector<process_trace> traces;
  for (const auto& entry : directory_entries(directory)) {
    const auto name = entry.path().filename().string();
    if (!entry.is_regular_file() || name.empty() || name[0] == '.') continue;
    auto digits = name.size();
    while (digits > 0 && std::isdigit(static_cast<unsigned char>(name[digits - 1])) != 0) --digits;
    if (digits == name.size()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    traces.push_back(read_process_trace(bytes, entry.path().string(), std::stoi(name.substr(digits))));
  }
  std::sort(traces.begin(), traces.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return traces;
}

trace_verdict analyse_traces(const std::vector<process_trace>& traces) {
  trace_verdict verdict;
  std::map<std::string, std::vector<int>> groups;
  for (const auto& t : traces)
    for (const auto& [name, ranks] : t.groups)
      if (groups[name].empty()) groups[name] = ranks;
  for (const auto& [group, ranks] : groups) {
    std::map<int, trace_internals::by_sequence> members;
    std::vector<int> without_dump;
    for (int r : ranks) {
      auto t = std::find_if(traces.begin(), traces.end(), [r](const auto& x) { return x.rank == r; });
      if (t == traces.end()) {
        without_dump.push_back(r);
        continue;
      }
      auto& seqs = members[r];
      if (auto c = t->collectives.find(group); c != t->collectives.end())
        for (const auto& collective : c->second) seqs[collective.sequence] = &collective;
    }
    if (!without_dump.empty())
      verdict.problems.push_back("group " + group + ": no flight record from " +
                                 trace_internals::processes(without_dump));
    std::int64_t last = 0;
    auto problem = trace_internals::first_problem(group, members, without_dump.empty(), last);
    if (problem.empty() && !without_dump.empty())
      problem = trace_internals::waiting_for_the_silent(group, members, without_dump);
    if (!problem.empty())
      verdict.problems.push_back(std::move(problem));
    else
      verdict.notes.push_back("group " + group + ": every collective up to " + std::to_string(last) + " matched on " +
                              trace_internals::processes(ranks));
  }
  return verdict;
}

}  // namespace accel::detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
