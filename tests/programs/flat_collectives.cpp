// The flat collectives the sharded policies build on, checked by arithmetic in a real job (tests/CMakeLists.txt
// starts it on 3 Gloo processes under `accel launch`), in both LibTorch builds: the all-gather is Gloo's
// `_allgather_base` in 2.x and the list form into views in 1.13 (detail/compat.hpp); the reduce-scatter is an
// all-to-all and a sum (detail/comm/gloo_communicator.hpp).
// Prints one line per failed check and exits 1 if any failed.
#include "accel_headers.hpp"

#include <cstdlib>
#include <iostream>

int main() {
  accel::accelerator<accel::fp32, accel::data_parallel<accel::gloo>> acc;  // makes the process group
  auto& comm = accel::detail::process_group<accel::detail::gloo_communicator>(std::chrono::minutes(1));
  const int P = comm.size(), r = comm.rank();
  int failures = 0;
  const auto check = [&](bool ok, const char* what, c10::ScalarType dtype, std::int64_t n) {
    if (ok) return;
    ++failures;
    std::cout << "process " << r << ": " << what << " of " << n << " " << c10::toString(dtype) << " elements a process"
              << " differs from the arithmetic\n";
  };
  for (const auto dtype : {at::kFloat, at::kDouble})
    for (const std::int64_t n : {1, 7, 1000}) {
      const auto options = at::TensorOptions().dtype(dtype);
      // all_gather_into: process q sends q * n + 1 ... q * n + n, so the gathered whole is 1 ... P n.
      auto mine = at::arange(r * n + 1, (r + 1) * n + 1, options);
      auto gathered = at::full({P * n}, -1, options);
      comm.all_gather_into(gathered, mine).wait();
      check(at::equal(gathered, at::arange(1, P * n + 1, options)), "all_gather_into", dtype, n);
      // In place: this process's part is already where the result puts it (Gloo: a broadcast per part).
      auto whole = at::full({P * n}, -1, options);
      auto part = whole.narrow(0, r * n, n);
      part.copy_(mine);
      comm.all_gather_into(whole, part).wait();
      check(at::equal(whole, at::arange(1, P * n + 1, options)), "all_gather_into in place", dtype, n);
      // reduce_scatter_into: process q sends (q + 1) x (1 ... P n); segment r sums to P (P + 1) / 2 x (r n + 1 ...).
      auto input = at::arange(1, P * n + 1, options) * (r + 1);
      auto output = at::full({n}, -1, options);
      comm.reduce_scatter_into(output, input).wait();
      check(at::equal(output, at::arange(r * n + 1, (r + 1) * n + 1, options) * (P * (P + 1) / 2)),
            "reduce_scatter_into", dtype, n);
    }
  comm.barrier();
  if (failures == 0 && r == 0)
    std::cout << "all_gather_into and reduce_scatter_into agree with the arithmetic on " << P << " processes (LibTorch "
              << TORCH_VERSION << ")\n";
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
