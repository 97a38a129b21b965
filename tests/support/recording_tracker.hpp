// A user-defined tracker for the tests: records what the accelerator gives it.
#pragma once

#include <accel/tracking.hpp>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace accel_test {

struct recording_tracker final : accel::general_tracker {
  struct entry {
    std::string name;
    double value;
    std::int64_t step;
    bool operator==(const entry&) const = default;
    friend std::ostream& operator<<(std::ostream& out, const entry& e) {
      return out << "{" << e.name << ", " << e.value << ", " << e.step << "}";
    }
  };

  [[nodiscard]] std::string name() const override { return "recorder"; }
  void store_init_configuration(const accel::hyperparameters& config) override { configs.push_back(config); }
  void log(const std::vector<accel::metric>& metrics, std::int64_t step) override {
    for (const auto& m : metrics) logged.push_back({m.name, m.value(), step});
  }
  void finish() override { ++finished; }

  std::vector<accel::hyperparameters> configs;
  std::vector<entry> logged;
  int finished = 0;
};

}  // namespace accel_test
