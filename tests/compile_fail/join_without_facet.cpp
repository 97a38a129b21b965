// expect-error: declares joins_uneven_inputs but lacks a hook of the uneven inputs facet
#include <accel/accel.hpp>
// Declares the capability without its facet: refused where the policy is named, not where a join is written.
struct joins_nothing : accel::data_parallel<accel::gloo> {
  using data_parallel::data_parallel;
  void finish_join() = delete;
};
accel::accelerator<accel::fp32, joins_nothing>* acc = nullptr;
