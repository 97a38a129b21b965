/// \file
/// How the processes of a save or a load agree: a step that fails on one process fails on every process, each with
/// an error that says where it failed, so that none is left waiting in a collective for one that gave up.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "../../collectives.hpp"
#include "../../options.hpp"
#include "../support/text.hpp"

namespace accel::detail {

/// The first line of the first failing process's reason among every process's (empty: it did not fail), as
/// "process r: reason".
ACCEL_DECL std::string first_failure(const std::vector<std::vector<char>>& reasons);

/// Runs `step` here, then agrees with every process on whether it succeeded everywhere (one all-reduce, which is
/// also the barrier between save_state's steps): a failure on any process is raised on all of them, there with
/// its own error, elsewhere naming the step and the first failing process's reason (gathered only then). `call` is
/// the accelerator's call in messages (`save_state`, `load_state`).
template <class Parallel, class Step>
void on_every_process_or_none(Parallel& parallel, std::string_view call, const std::string& step_name, Step&& step) {
  std::exception_ptr failure;
  std::string reason;
  try {
    std::forward<Step>(step)();
  } catch (const std::filesystem::filesystem_error& e) {  // the checkpoint's I/O errors are checkpoint_error
    reason = "accel::" + std::string(call) + ": " + e.what();
    failure = std::make_exception_ptr(checkpoint_error(reason));
  } catch (const std::exception& e) {
    reason = e.what();
    failure = std::current_exception();
  } catch (...) {
    reason = "an exception that is not a std::exception";
    failure = std::current_exception();
  }
  if (!on_any_process(parallel, failure != nullptr)) return;
  auto&& comm = parallel.communicator();
  const auto reasons = all_gather_bytes(comm, std::vector<char>(reason.begin(), reason.end()));
  if (failure) std::rethrow_exception(failure);
  throw checkpoint_error("accel::" + std::string(call) + ": another process failed while " + step_name + " (" +
                         first_failure(reasons) + ")");
}

/// Runs `action`, a collective of the accelerator's `call`: a collective that fails in it (a timeout, a process
/// gone) says that every process must make that call, the usual cause of a save that never completes.
template <class Action>
void as_collective(const char* call, Action&& action) {
  try {
    std::forward<Action>(action)();
  } catch (const collective_error& e) {
    throw collective_error(std::string(e.what()) + "; accel::" + call +
                           " is a collective: every process must call it (a call under `if (acc.is_main_process())` "
                           "waits for the others until options::timeout)");
  }
}

/// Whether this process writes the checkpoint's shared files: the main process, or with `save_on_each_node` each
/// machine's local main process.
template <class Parallel>
bool writes_shared_files(const project_options& project, const Parallel& parallel) {
  return (project.save_on_each_node ? parallel.local_process_index() : parallel.process_index()) == 0;
}

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/agreement.ipp"
#endif
