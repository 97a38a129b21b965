// expect-error: accel::configs<...>: an entry can never be chosen
#include <accel/accel.hpp>
// accumulate_dynamic takes any N, so the first entry fits every run the second fits: dispatch never builds the second.
using supported =
    accel::configs<accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>, accel::accumulate_dynamic>,
                   accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>, accel::accumulate<4>>>;
int run() {
  return accel::dispatch<supported>(accel::read_run_config(),
                                    [](auto& acc) { return acc.gradient_accumulation_steps(); });
}
