/// \file
/// `load_transaction`: objects loaded all or none.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "../support/text.hpp"

namespace accel::detail {

/// Loads objects that can also save what they hold, all or none: before an object loads, its current state is kept
/// (serialised in memory); should a later load fail, every object loaded before it gets its state back. Objects
/// loaded into a freshly built program hold little, so the copies are small.
class load_transaction {
 public:
  load_transaction() = default;
  load_transaction(const load_transaction&) = delete;
  load_transaction& operator=(const load_transaction&) = delete;
  ~load_transaction() { roll_back(); }

  /// Loads `source` with `load`, having kept what `save` writes now, which `restore` (by default `load`) puts back
  /// should a later load fail; `what` names the object in an error.
  template <class Save, class Load>
  void load(const std::string& what, Save save, Load load, torch::serialize::InputArchive& source) {
    this->load(what, std::move(save), load, source, load);
  }
  template <class Save, class Load, class Restore>
  void load(const std::string& what, Save save, Load load, torch::serialize::InputArchive& source, Restore restore) {
    torch::serialize::OutputArchive before;
    save(before);
    auto bytes = std::make_shared<std::stringstream>();
    before.save_to(*bytes);
    try {
      load(source);
    } catch (const checkpoint_error& e) {
      throw checkpoint_error("accel::load_state: " + what + " " + e.what() + "; nothing was loaded");
    } catch (const std::exception& e) {
      throw checkpoint_error("accel::load_state: " + what + " does not fit the object it is loaded into (saved " +
                             "from another kind of object, or a damaged file?): " + first_line(e.what()) +
                             "; nothing was loaded");
    }
    undo_.emplace_back([bytes, restore] {
      torch::serialize::InputArchive previous;
      previous.load_from(*bytes);
      restore(previous);
    });
  }
  /// Keeps what was loaded.
  void commit() noexcept { undo_.clear(); }
  /// Gives every object loaded so far its state back (what destroying an uncommitted transaction does).
  ACCEL_DECL void roll_back() noexcept;

 private:
  std::vector<std::function<void()>> undo_;
};

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/transaction.ipp"
#endif
