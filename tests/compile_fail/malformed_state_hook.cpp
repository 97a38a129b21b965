// expect-error: this policy declares save_state or load_state, but not as save_state\(torch::serialize::OutputArchive&\) const
#include <accel/accel.hpp>
// A precision policy whose state hooks take the wrong argument: without the check they would be skipped silently
// and its state would be lost at every restart.
struct remembering_precision : accel::fp32 {
  using accel::fp32::fp32;
  void save_state(int& archive) const;
  void load_state(int& archive);
};
accel::accelerator<remembering_precision> acc;
