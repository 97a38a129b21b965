/// \file
/// Collective operations across the processes of a job, as Accelerate's `gather`, `gather_object`, `reduce`,
/// `pad_across_processes` and `broadcast`. They are written once over a `communicator` (Gloo, NCCL, or the
/// local one of a single process, where every collective is the identity), and reached through the accelerator:
/// `acc.gather(t)`, `acc.reduce(t, accel::reduction::mean)`...
///
/// Tensors may come nested, where Accelerate accepts nested structures: `std::vector`, `std::tuple`,
/// `std::pair` and `std::map<std::string, ...>` of tensors, to any depth.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/data/example.h>

#include "detail/config.hpp"
#include "detail/data/batch_channel.hpp"
#include "detail/comm/ivalue_form.hpp"
#include "detail/support/tensor_structure.hpp"
#include "detail/support/text.hpp"

#include <algorithm>
#include <cctype>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace accel {

/// How `reduce` combines the processes' tensors. Accelerate's Accelerator defaults to sum.
enum class reduction { sum, mean, max };

/// A collective that failed: a timeout, a process that stopped, a broken connection.
struct collective_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A collective called with tensors whose shapes differ between processes, found in debug mode
/// (`ACCELERATE_DEBUG_MODE=1`), as Accelerate's `DistributedOperationException`.
struct distributed_operation_error : collective_error {
  using collective_error::collective_error;
};

/// What a backend offers the collectives: in-place asynchronous all-reduce (sum, max), asynchronous sum
/// reduce-scatter and flat all-gather, broadcast, all-gather of equal shapes, barrier.
template <class C>
concept communicator = requires(C& c, const C& cc, at::Tensor& tensor, const at::Tensor& input) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.all_reduce(tensor, reduction::sum).wait();
  c.broadcast(tensor, 0);
  { c.all_gather(input) } -> std::same_as<std::vector<at::Tensor>>;
  c.all_gather_into(tensor, tensor).wait();      // into one flat tensor of size() * n elements, in rank order
  c.reduce_scatter_into(tensor, tensor).wait();  // the sum of every process's r-th of size() segments, on process r
  c.barrier();
};

/// The communicator of a single process: every collective is the identity.
struct local_communicator {
  struct work {
    static constexpr void wait() noexcept {}
  };
  [[nodiscard]] static constexpr int rank() noexcept { return 0; }
  [[nodiscard]] static constexpr int size() noexcept { return 1; }
  [[nodiscard]] static constexpr work all_reduce(at::Tensor&, reduction) noexcept { return {}; }
  static constexpr void broadcast(at::Tensor&, int) noexcept {}
  [[nodiscard]] static std::vector<at::Tensor> all_gather(const at::Tensor& tensor) { return {tensor}; }
  ACCEL_DECL static work all_gather_into(at::Tensor& output, const at::Tensor& input);
  ACCEL_DECL static work reduce_scatter_into(at::Tensor& output, const at::Tensor& input);
  static constexpr void barrier() noexcept {}
  /// Another communicator of this one process (what `separate` gives on a real backend: collectives ordered apart).
  [[nodiscard]] static std::unique_ptr<local_communicator> separate(const std::string&) {
    return std::make_unique<local_communicator>();
  }
};

namespace detail {

/// Accelerate's debug mode: before each collective, check that every process passes the same shapes.
ACCEL_DECL bool debug_mode();

template <class T>
void require_tensor_structure() {
  static_assert(is_tensor_structure<T>,
                "accel collectives take an at::Tensor or a std::vector/std::tuple/std::pair/std::map<std::string, "
                "...> of them; use gather_object for other values");
}

ACCEL_DECL std::string shape_text(at::IntArrayRef shape);

/// `value` in LibTorch's pickle format (`torch::jit::pickle_save`), and back: compiled once, so that the headers
/// need not include the TorchScript serializer.
ACCEL_DECL std::vector<char> pickle_bytes(const c10::IValue& value);
ACCEL_DECL c10::IValue unpickle_bytes(const std::vector<char>& bytes);

/// The bytes of `tensor`'s data, gathered from every process (lengths may differ).
template <communicator C>
std::vector<std::vector<char>> all_gather_bytes(C& comm, const std::vector<char>& bytes) {
  auto length = at::tensor({static_cast<std::int64_t>(bytes.size())}, at::kLong);
  auto lengths = comm.all_gather(length);
  std::int64_t longest = 0;
  for (const auto& l : lengths) longest = std::max(longest, l.template item<std::int64_t>());
  auto padded = at::zeros({longest}, at::kChar);
  std::copy(bytes.begin(), bytes.end(), padded.data_ptr<std::int8_t>());
  auto gathered = comm.all_gather(padded);
  std::vector<std::vector<char>> out;
  for (std::size_t r = 0; r < gathered.size(); ++r) {
    const auto* data = reinterpret_cast<const char*>(gathered[r].template data_ptr<std::int8_t>());
    out.emplace_back(data, data + lengths[r].template item<std::int64_t>());
  }
  return out;
}

/// Debug mode's check: the shapes and dtypes every process passed to `operation` must be equal. Without it, a gather
/// of differing shapes gives some processes wrong values and then fails in the backend (Gloo: "op.preamble.length
/// <= op.nbytes"), or hangs, as in Accelerate; the check costs one more collective, which is why it is opt-in.
template <communicator C>
void verify_same_shapes(C& comm, const at::Tensor& tensor, const char* operation) {
  if (comm.size() == 1 || !debug_mode()) return;
  auto described = tensor.sizes().vec();
  described.insert(described.begin(), static_cast<std::int64_t>(tensor.scalar_type()));
  auto shapes = all_gather_bytes(comm, pickle_bytes(c10::IValue(described)));
  std::vector<std::vector<std::int64_t>> all;
  for (const auto& bytes : shapes) all.push_back(unpickle_bytes(bytes).toIntVector());
  if (std::ranges::all_of(all, [&](const auto& shape) { return shape == all.front(); })) return;
  std::string listing;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const auto dtype = c10::toString(static_cast<at::ScalarType>(all[r].front()));
    listing += (r ? ", " : "") + std::string("process ") + std::to_string(r) + ": " + dtype + " " +
               shape_text(at::IntArrayRef(all[r]).slice(1));
  }
  throw distributed_operation_error(std::string("accel: cannot ") + operation +
                                    ": the tensor shapes or dtypes differ between processes (" + listing +
                                    "); every process must pass the same shape and dtype (pad_across_processes "
                                    "equalises a dimension)");
}

template <communicator C, class T>
T gather(C& comm, const T& data) {
  require_tensor_structure<T>();
  if (comm.size() == 1) return data;
  auto one = [&](const at::Tensor& tensor) {
    verify_same_shapes(comm, tensor, "gather");
    auto input = tensor.dim() == 0 ? tensor.reshape({1}) : tensor;  // 0-d tensors gather into a vector
    return at::cat(comm.all_gather(input.contiguous()), 0);
  };
  return map_tensors(data, one);
}

/// `scale` multiplies the result (Accelerate's `reduce(..., scale)`; integers then give floats).
template <communicator C, class T>
T reduce(C& comm, const T& data, reduction op, double scale = 1.0) {
  require_tensor_structure<T>();
  auto one = [&](const at::Tensor& tensor) {
    verify_same_shapes(comm, tensor, "reduce");
    auto result = tensor.clone(at::MemoryFormat::Contiguous);
    comm.all_reduce(result, op == reduction::max ? reduction::max : reduction::sum).wait();
    if (op == reduction::mean) result = result.div(comm.size());  // integers give floats, as t / P in PyTorch
    if (scale != 1.0) result = result.mul(scale);
    return result;
  };
  return map_tensors(data, one);
}

/// Whether `here` is true on any process (one all-reduce; a collective, as every caller is).
/// `parallel` is a parallel policy (single_process returns its communicator by value).
template <class Parallel>
bool on_any_process(Parallel& parallel, bool here) {
  auto&& comm = parallel.communicator();
  return reduce(comm, at::scalar_tensor(here ? 1 : 0, at::kInt), reduction::max).template item<int>() != 0;
}

template <communicator C, class T>
T broadcast(C& comm, const T& data, int from_process) {
  require_tensor_structure<T>();
  if (from_process < 0 || from_process >= comm.size())
    throw std::out_of_range("accel::broadcast: from_process " + std::to_string(from_process) +
                            " is not a process of this job (0 to " + std::to_string(comm.size() - 1) + ")");
  auto one = [&](const at::Tensor& tensor) {
    verify_same_shapes(comm, tensor, "broadcast");
    auto buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
    comm.broadcast(buffer, from_process);
    if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    return tensor;
  };
  return map_tensors(data, one);
}

/// `from_process`'s `bytes` on every process (its length first, then the bytes).
template <communicator C>
std::vector<char> broadcast_bytes(C& comm, const std::vector<char>& bytes, int from_process) {
  const bool source = comm.rank() == from_process;
  auto length = at::tensor({source ? static_cast<std::int64_t>(bytes.size()) : std::int64_t{0}}, at::kLong);
  comm.broadcast(length, from_process);
  const auto n = length.template item<std::int64_t>();
  auto buffer = at::empty({n}, at::kChar);
  if (source) std::copy(bytes.begin(), bytes.end(), buffer.template data_ptr<std::int8_t>());
  comm.broadcast(buffer, from_process);
  if (source) return bytes;
  const auto* data = reinterpret_cast<const char*>(buffer.template data_ptr<std::int8_t>());
  return {data, data + n};
}

/// `value` pickled (ivalue_form.hpp), and back.
template <ivalue_holds T>
std::vector<char> pickled(const T& value) {
  return pickle_bytes(ivalue_form<T>::to(value));
}
template <ivalue_holds T>
T unpickled(const std::vector<char>& bytes) {
  return ivalue_form<T>::from(unpickle_bytes(bytes));
}

template <communicator C, class T>
void broadcast_object_list(C& comm, std::vector<T>& objects, int from_process) {
  static_assert(ivalue_holds<T>,
                "accel::broadcast_object_list takes values a c10::IValue holds (numbers, bools, strings, tensors, and "
                "std::vector/std::pair/std::tuple/std::map<std::string, ...> of them) or types with "
                "save(torch::serialize::OutputArchive&) const, load(torch::serialize::InputArchive&) and a default "
                "constructor");
  if (from_process < 0 || from_process >= comm.size())
    throw std::out_of_range("accel::broadcast_object_list: from_process " + std::to_string(from_process) +
                            " is not a process of this job (0 to " + std::to_string(comm.size() - 1) + ")");
  if (comm.size() == 1) return;
  std::vector<char> bytes;
  if (comm.rank() == from_process) bytes = pickled(objects);
  bytes = broadcast_bytes(comm, bytes, from_process);
  if (comm.rank() != from_process) objects = unpickled<std::vector<T>>(bytes);
}

template <communicator C, class T>
T pad_across_processes(C& comm, const T& data, std::int64_t dim, double pad_index, bool pad_first) {
  require_tensor_structure<T>();
  auto one = [&](const at::Tensor& tensor) -> at::Tensor {
    if (dim >= tensor.dim() || dim < -tensor.dim()) return tensor;  // nothing to pad along, as Accelerate
    const auto axis = dim < 0 ? dim + tensor.dim() : dim;
    auto sizes = comm.all_gather(at::tensor({tensor.size(axis)}, at::kLong));
    std::int64_t longest = 0;
    for (const auto& s : sizes) longest = std::max(longest, s.template item<std::int64_t>());
    if (longest == tensor.size(axis)) return tensor;
    auto shape = tensor.sizes().vec();
    shape[axis] = longest;
    auto padded = at::full(shape, pad_index, tensor.options());
    const auto start = pad_first ? longest - tensor.size(axis) : 0;
    padded.narrow(axis, start, tensor.size(axis)).copy_(tensor);
    return padded;
  };
  return map_tensors(data, one);
}

template <class T>
inline constexpr bool is_vector = false;
template <class T>
inline constexpr bool is_vector<std::vector<T>> = true;

/// Every process's `value`, in process order; a `std::vector` is flattened one level (Accelerate's
/// `gather_object([r])` gives `[0, 1, ...]`). Values travel pickled (ivalue_form.hpp).
template <communicator C, class T>
auto gather_object(C& comm, const T& value) {
  static_assert(ivalue_holds<T>,
                "accel::gather_object takes values a c10::IValue holds (numbers, bools, strings, tensors, and "
                "std::vector/std::pair/std::tuple/std::map<std::string, ...> of them) or types with "
                "save(torch::serialize::OutputArchive&) const, load(torch::serialize::InputArchive&) and a default "
                "constructor");
  std::vector<T> per_process;
  if (comm.size() == 1) {
    per_process.push_back(value);
  } else {
    for (const auto& bytes : all_gather_bytes(comm, pickled(value))) per_process.push_back(unpickled<T>(bytes));
  }
  if constexpr (is_vector<T>) {
    T flat;
    for (auto& items : per_process) flat.insert(flat.end(), items.begin(), items.end());
    return flat;
  } else {
    return per_process;
  }
}

/// `gather` of tensors whose first dimension may differ between processes: each padded to the longest, gathered,
/// and each process's own rows kept. The last batch of `dispatch_batches` is such a case: a process's slice of a short
/// global batch can hold fewer samples, or none (Accelerate slices it so too).
template <communicator C, class T>
T gather_ragged(C& comm, const T& data) {
  require_tensor_structure<T>();
  if (comm.size() == 1) return data;
  auto one = [&](const at::Tensor& tensor) {
    const auto input = tensor.dim() == 0 ? tensor.reshape({1}) : tensor;
    const auto rows = comm.all_gather(at::tensor({input.size(0)}, at::kLong));
    const auto padded = pad_across_processes(comm, input, 0, 0, false);
    auto parts = comm.all_gather(padded.contiguous());
    for (std::size_t r = 0; r < parts.size(); ++r)
      parts[r] = parts[r].narrow(0, 0, rows[r].template item<std::int64_t>());
    return at::cat(parts, 0);
  };
  return map_tensors(data, one);
}

/// `data` where it counts for the metrics (`counted`: on one of the processes that read the same batch) as it is; on
/// the others nothing, no rows (of each tensor) or no elements (`by_object`: of a `std::vector`), so that each batch
/// is gathered once.
template <class Data>
Data counted_once(const Data& data, bool counted, bool by_object) {
  if (counted) return data;
  if constexpr (is_tensor_structure<Data>) {
    auto no_rows = [](const at::Tensor& t) { return (t.dim() == 0 ? t.reshape({1}) : t).narrow(0, 0, 0); };
    if (!by_object) return map_tensors(data, no_rows);
  }
  if constexpr (is_vector<Data>) {
    return Data{};
  } else {
    return data;  // refused by gather_for_metrics
  }
}

/// `gather`, then only the first `keep` samples (all when `keep` <= 0): Accelerate's `gather_for_metrics`, which
/// drops what even_batches duplicated on the last batch (where the processes' batches may differ in length, and be
/// empty: `gather_ragged`). Tensors (nested or not) are gathered; a `std::vector` of other values, or of any values
/// with `use_gather_object` (tensors whose shapes differ between samples, say), goes through `gather_object`: every
/// process's elements, one sample each. `shared`: several processes read each batch (a mesh's tp, cp and pp peers), of
/// which only the one `counted` contributes its data (`counted_once`).
template <communicator C, class Data>
Data gather_for_metrics(C& comm, const Data& data, std::int64_t keep, bool use_gather_object = false,
                        bool counted = true, bool shared = false) {
  const auto part = counted_once(data, counted, use_gather_object);
  if constexpr (is_tensor_structure<Data>) {
    if (!use_gather_object) {
      if (keep <= 0 && !shared) return gather(comm, part);
      auto truncate = [keep](const at::Tensor& t) { return t.narrow(0, 0, std::min(keep, t.size(0))); };
      auto gathered = gather_ragged(comm, part);
      return keep <= 0 ? gathered : map_tensors(gathered, truncate);
    }
  }
  if constexpr (is_vector<Data>) {
    auto gathered = gather_object(comm, part);
    if (keep > 0 && static_cast<std::int64_t>(gathered.size()) > keep) gathered.resize(static_cast<std::size_t>(keep));
    return gathered;
  } else if constexpr (is_tensor_structure<Data>) {
    throw std::invalid_argument(
        "accel::gather_for_metrics: use_gather_object gathers a std::vector of samples (a std::vector<at::Tensor> of "
        "tensors whose shapes differ, say); this data is tensors that are not in a std::vector: gather them without "
        "use_gather_object, or pass the samples as a std::vector");
  } else {
    static_assert(is_vector<Data>, "accel::gather_for_metrics takes tensors, or a std::vector of values");
  }
}

/// `options::dispatch_batches`' channel: process 0's batch (or the end) broadcast to every process, pickled.
template <communicator C, class Batch>
class broadcast_channel final : public batch_channel<Batch> {
 public:
  explicit broadcast_channel(C& comm) : comm_(&comm) {}
  std::optional<Batch> from_main(std::optional<Batch> batch) override {
    const bool main = comm_->rank() == 0;
    std::vector<char> bytes;  // empty: the input has ended (a pickle is never empty)
    if (main && batch) bytes = pickled(*batch);
    bytes = broadcast_bytes(*comm_, bytes, 0);
    if (bytes.empty()) return std::nullopt;
    if (main) return batch;
    return unpickled<Batch>(bytes);
  }

 private:
  C* comm_;
};

}  // namespace detail
}  // namespace accel

#if ACCEL_HEADER_ONLY
#include "impl/collectives.ipp"
#endif
