// accel_test::scoped_variable, without LibTorch: the mesh's tests (plain C++) use it as well as support.hpp's users.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace accel_test {

/// Sets (or, with nullptr, unsets) one environment variable for the scope, restoring it after.
class scoped_variable {
 public:
  scoped_variable(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    value != nullptr ? setenv(name, value, 1) : unsetenv(name);
  }
  ~scoped_variable() { saved_ ? setenv(name_, saved_->c_str(), 1) : unsetenv(name_); }
  scoped_variable(const scoped_variable&) = delete;
  scoped_variable& operator=(const scoped_variable&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

}  // namespace accel_test
