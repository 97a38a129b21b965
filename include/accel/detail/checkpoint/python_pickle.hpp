/// \file
/// `read_torch_save`: the value a Python `torch.save` file holds (its zip archive: `data.pkl` and the tensors' raw
/// storages), as a `c10::IValue`. LibTorch's `torch::pickle_load` reads such files only while every Python class in
/// them is one it knows, and Accelerate's `random_states_{i}.pkl` holds NumPy arrays; so this small pickle machine
/// runs the opcodes `torch.save` writes (protocol 2), rebuilds tensors, and turns every other Python object (a NumPy
/// array, a `random` state's class) into `None`: what accel does not use, it does not need to understand.
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <unordered_map>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"

namespace accel::detail {

/// The dtype of a `torch.FloatStorage`-style class name (what `torch.save` names a tensor's storage by).
ACCEL_DECL at::ScalarType storage_dtype(const std::string& name, const std::string& file);

/// How deep the lists, dicts and tuples of a `torch.save` file may nest: deeper is refused (a checkpoint's state
/// dicts nest a few levels; a hostile file nested a million deep would exhaust the stack when its value is freed).
inline constexpr std::size_t max_pickle_depth = 256;

/// One run of the pickle machine over `data.pkl` of a `torch.save` archive. A container may not change once it is
/// inside another (torch.save fills each before placing it), so that each one's depth is final when it is placed,
/// and no value contains itself.
class torch_save_unpickler {
 public:
  ACCEL_DECL torch_save_unpickler(caffe2::serialize::PyTorchStreamReader& archive, std::string file);

  ACCEL_DECL c10::IValue run();

 private:
  [[noreturn]] ACCEL_DECL void fail(const std::string& why) const;
  ACCEL_DECL std::string take(std::size_t n);
  template <class T>
  T little(std::size_t n = sizeof(T)) {
    T value{};
    std::memcpy(&value, take(n).data(), n);  // the pickle's integers are little-endian, as this machine's
    return value;
  }
  ACCEL_DECL c10::IValue pop();
  /// The values above the last MARK, removed.
  ACCEL_DECL std::vector<c10::IValue> pop_to_mark();
  void push_tuple(std::vector<c10::IValue> items) {
    c10::IValue tuple(c10::ivalue::Tuple::create(items));
    contain(tuple, items);
    stack_.push_back(std::move(tuple));
  }
  ACCEL_DECL void push_tuple_of(std::size_t n);
  ACCEL_DECL void set_items(std::vector<c10::IValue> items);
  ACCEL_DECL void append(std::vector<c10::IValue> items);
  /// Records that `container` (a list, dict or tuple) now holds `items`: each item sealed, the container's depth
  /// counted; refused for a sealed container or one past `max_pickle_depth`.
  ACCEL_DECL void contain(const c10::IValue& container, const std::vector<c10::IValue>& items);

  /// The opcodes that start containers; false for another.
  ACCEL_DECL bool container_step(unsigned char op);
  /// The opcodes that fill lists and dicts; false for another.
  ACCEL_DECL bool fill_step(unsigned char op);
  /// The opcodes that push a constant or an integer; false for another.
  ACCEL_DECL bool constant_step(unsigned char op);
  /// The opcodes that push a float or a string; false for another.
  ACCEL_DECL bool text_step(unsigned char op);
  ACCEL_DECL void step(unsigned char op);

  ACCEL_DECL static std::string hex(unsigned char op);
  ACCEL_DECL c10::IValue peek();
  ACCEL_DECL void recall(std::uint32_t key);
  ACCEL_DECL void long1();
  ACCEL_DECL void binfloat();
  /// A global (a class or function) is kept as its dotted name: only REDUCE and BINPERSID look at it.
  ACCEL_DECL void global();
  /// A call: a tensor rebuilt, an OrderedDict made; any other object (NumPy's) becomes None.
  ACCEL_DECL void reduce();
  /// A tuple of ints (a tensor's size or stride).
  ACCEL_DECL std::vector<std::int64_t> integers(const c10::IValue& tuple);
  /// A persistent id ('storage', torch.FloatStorage, key, location, numel): the record `data/{key}`, flat.
  ACCEL_DECL at::Tensor storage(const c10::IValue& id);

  caffe2::serialize::PyTorchStreamReader& archive_;
  std::string file_;
  std::string bytes_;
  std::size_t at_ = 0;
  std::vector<c10::IValue> stack_;
  std::vector<std::size_t> marks_;
  std::map<std::size_t, c10::IValue> memo_;
  std::map<std::string, at::Tensor> storages_;
  /// Each container that holds something, kept alive here (its address then names only it): its depth, and whether
  /// it is inside another.
  struct container_state {
    c10::IValue value;
    std::size_t depth = 1;
    bool sealed = false;
  };
  std::unordered_map<const void*, container_state> containers_;
};

/// The inverse: a value as `torch.save` writes it, in the pickle opcodes above and no class but those PyTorch's
/// `torch.load(weights_only=True)` (which Accelerate's `load` uses) allows: tensors (as `_rebuild_tensor_v2` of a
/// typed storage), `OrderedDict` for their hooks. LibTorch's own `pickle_save` tags dicts with a TorchScript class,
/// which `weights_only` refuses.
class torch_save_pickler {
 public:
  explicit torch_save_pickler(caffe2::serialize::PyTorchStreamWriter& archive) : archive_(archive) {}

  ACCEL_DECL std::string run(const c10::IValue& value);

 private:
  template <class T>
  void little(T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out_.append(bytes, sizeof(T));
  }
  ACCEL_DECL void text(const std::string& value);
  ACCEL_DECL void integer(std::int64_t value);
  ACCEL_DECL void real(double value);
  ACCEL_DECL void push(const c10::IValue& value);
  /// `torch._utils._rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict())`, its storage a record.
  ACCEL_DECL void tensor(const at::Tensor& value);

  caffe2::serialize::PyTorchStreamWriter& archive_;
  std::string out_;
  std::size_t records_ = 0;
};

/// The bytes of a `torch.save` file holding `value` (what `read_torch_save` and Python's `torch.load` read).
ACCEL_DECL std::string torch_save_bytes(const c10::IValue& value);

/// The value of the `torch.save` file whose bytes are `bytes` (`file` names it in errors).
ACCEL_DECL c10::IValue read_torch_save(const std::string& bytes, const std::string& file);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/python_pickle.ipp"
#endif
