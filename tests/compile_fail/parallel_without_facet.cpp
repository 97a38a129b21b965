// expect-error: this parallel policy lacks a hook of the model preparation facet
#include <accel/accel.hpp>
// A topology and the defaults, a model preparation without before_forward.
struct half_written : accel::parallel_defaults, accel::process_group_topology<accel::gloo> {
  using policy_category = accel::parallel_tag;
  using process_group_topology::process_group_topology;
  void prepare_model(torch::nn::Module&) {}
  bool gradient_sync(const torch::nn::Module&) const { return true; }
  void set_gradient_sync(const torch::nn::Module&, bool, bool) {}
};
accel::accelerator<accel::fp32, half_written>* acc = nullptr;
