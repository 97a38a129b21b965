/// \file
/// What python_pickle.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../python_pickle.hpp"

namespace accel::detail {

at::ScalarType storage_dtype(const std::string& name, const std::string& file) {
  static const std::map<std::string, at::ScalarType> dtypes{
      {"torch.FloatStorage", at::kFloat},       {"torch.DoubleStorage", at::kDouble}, {"torch.HalfStorage", at::kHalf},
      {"torch.BFloat16Storage", at::kBFloat16}, {"torch.LongStorage", at::kLong},     {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},       {"torch.CharStorage", at::kChar},     {"torch.ByteStorage", at::kByte},
      {"torch.BoolStorage", at::kBool}};
  const auto found = dtypes.find(name);
  if (found == dtypes.end())
    throw checkpoint_error(file + " holds a tensor stored as " + name + ", which accel reads not");
  return found->second;
}

torch_save_unpickler::torch_save_unpickler(caffe2::serialize::PyTorchStreamReader& archive, std::string file)
    : archive_(archive), file_(std::move(file)) {
  const auto [data, size] = archive_.getRecord("data.pkl");
  bytes_.assign(static_cast<const char*>(data.get()), size);
}

c10::IValue torch_save_unpickler::run() {
  for (;;) {
    const auto op = static_cast<unsigned char>(take(1)[0]);
    if (op == '.') break;  // STOP
    step(op);
  }
  if (stack_.size() != 1) fail("ends with " + std::to_string(stack_.size()) + " values");
  return stack_.back();
}

void torch_save_unpickler::fail(const std::string& why) const {
  throw checkpoint_error(file_ + " is not a torch.save file accel can read: its pickle " + why);
}

std::string torch_save_unpickler::take(std::size_t n) {
  if (at_ + n > bytes_.size()) fail("is cut short");
  auto part = bytes_.substr(at_, n);
  at_ += n;
  return part;
}

c10::IValue torch_save_unpickler::pop() {
  if (stack_.empty()) fail("pops an empty stack");
  auto value = std::move(stack_.back());
  stack_.pop_back();
  return value;
}

std::vector<c10::IValue> torch_save_unpickler::pop_to_mark() {
  if (marks_.empty()) fail("has no MARK");
  std::vector<c10::IValue> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
  stack_.resize(marks_.back());
  marks_.pop_back();
  return items;
}

void torch_save_unpickler::push_tuple_of(std::size_t n) {
  if (stack_.size() < n) fail("builds a tuple from too few values");
  std::vector<c10::IValue> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
  stack_.resize(stack_.size() - n);
  push_tuple(std::move(items));
}

void torch_save_unpickler::contain(const c10::IValue& container, const std::vector<c10::IValue>& items) {
  auto& held = containers_[container.internalToPointer()];
  held.value = container;
  for (const auto& item : items) {
    if (!item.isList() && !item.isGenericDict() && !item.isTuple()) continue;
    auto& inner = containers_[item.internalToPointer()];
    inner.value = item;
    inner.sealed = true;
    held.depth = std::max(held.depth, inner.depth + 1);
  }
  if (held.sealed) fail("changes a list or dict after placing it in another (torch.save never does; a cycle?)");
  if (held.depth > max_pickle_depth)
    fail("nests lists, dicts and tuples more than " + std::to_string(max_pickle_depth) +
         " levels deep (the limit of what is read)");
}

void torch_save_unpickler::set_items(std::vector<c10::IValue> items) {
  if (items.size() % 2 != 0 || stack_.empty() || !stack_.back().isGenericDict()) fail("sets items of no dict");
  contain(stack_.back(), items);
  auto dict = stack_.back().toGenericDict();
  for (std::size_t i = 0; i < items.size(); i += 2) dict.insert_or_assign(items[i], items[i + 1]);
}

void torch_save_unpickler::append(std::vector<c10::IValue> items) {
  if (stack_.empty() || !stack_.back().isList()) fail("appends to no list");
  contain(stack_.back(), items);
  auto list = stack_.back().toList();
  for (auto& item : items) list.push_back(std::move(item));
}

bool torch_save_unpickler::container_step(unsigned char op) {
  switch (op) {
    case '(':
      marks_.push_back(stack_.size());
      return true;
    case '}':
      stack_.emplace_back(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
      return true;
    case ']':
      stack_.emplace_back(c10::impl::GenericList(c10::AnyType::get()));
      return true;
    case ')':
      push_tuple({});
      return true;
    case 't':
      push_tuple(pop_to_mark());
      return true;
    case 0x85:
    case 0x86:
    case 0x87:
      push_tuple_of(op - 0x84u);
      return true;  // TUPLE1..3
    default:
      return false;
  }
}

bool torch_save_unpickler::fill_step(unsigned char op) {
  switch (op) {
    case 'a':
      append({pop()});
      return true;
    case 'e':
      append(pop_to_mark());
      return true;
    case 's': {
      auto value = pop();
      auto key = pop();
      set_items({key, value});
      return true;
    }
    case 'u':
      set_items(pop_to_mark());
      return true;
    default:
      return false;
  }
}

bool torch_save_unpickler::constant_step(unsigned char op) {
  switch (op) {
    case 'N':
      stack_.emplace_back();
      return true;
    case 0x88:
      stack_.emplace_back(true);
      return true;
    case 0x89:
      stack_.emplace_back(false);
      return true;
    case 'J':
      stack_.emplace_back(static_cast<std::int64_t>(little<std::int32_t>()));
      return true;
    case 'K':
      stack_.emplace_back(static_cast<std::int64_t>(little<std::uint8_t>()));
      return true;
    case 'M':
      stack_.emplace_back(static_cast<std::int64_t>(little<std::uint16_t>()));
      return true;
    case 0x8a:
      long1();
      return true;
    default:
      return false;
  }
}

bool torch_save_unpickler::text_step(unsigned char op) {
  switch (op) {
    case 'G':
      binfloat();
      return true;
    case 'X':
    case 'B':
      stack_.emplace_back(take(little<std::uint32_t>()));
      return true;  // BINUNICODE, BINBYTES
    case 0x8c:
    case 'C':
      stack_.emplace_back(take(little<std::uint8_t>()));
      return true;  // their short forms
    default:
      return false;
  }
}

void torch_save_unpickler::step(unsigned char op) {
  if (container_step(op) || fill_step(op) || constant_step(op) || text_step(op)) return;
  switch (op) {
    case 0x80:
      take(1);
      return;  // PROTO
    case 'q':
      memo_[little<std::uint8_t>()] = peek();
      return;
    case 'r':
      memo_[little<std::uint32_t>()] = peek();
      return;
    case 0x94:
      memo_[memo_.size()] = peek();
      return;  // MEMOIZE
    case 'h':
      recall(little<std::uint8_t>());
      return;
    case 'j':
      recall(little<std::uint32_t>());
      return;
    case 'c':
      global();
      return;
    case 'R':
      reduce();
      return;
    case 'b':
      pop();
      return;  // BUILD: the state of an object accel does not use (a NumPy array's)
    case 'Q':
      stack_.emplace_back(storage(pop()));
      return;  // BINPERSID
    default:
      fail("has opcode 0x" + hex(op) + ", which torch.save does not write");
  }
}

std::string torch_save_unpickler::hex(unsigned char op) {
  const char* digits = "0123456789abcdef";
  return {digits[op >> 4], digits[op & 15]};
}

c10::IValue torch_save_unpickler::peek() {
  if (stack_.empty()) fail("memoises an empty stack");
  return stack_.back();
}

void torch_save_unpickler::recall(std::uint32_t key) {
  const auto found = memo_.find(key);
  if (found == memo_.end()) fail("recalls a value it never stored");
  stack_.push_back(found->second);
}

void torch_save_unpickler::long1() {
  const auto n = little<std::uint8_t>();
  if (n > 8) fail("holds an integer wider than 64 bits");
  std::uint64_t value = 0;
  const auto raw = take(n);
  for (std::size_t i = 0; i < n; ++i) value |= std::uint64_t(static_cast<unsigned char>(raw[i])) << (8 * i);
  if (n > 0 && n < 8 && (static_cast<unsigned char>(raw[n - 1]) & 0x80)) value |= ~std::uint64_t(0) << (8 * n);
  stack_.emplace_back(static_cast<std::int64_t>(value));
}

void torch_save_unpickler::binfloat() {  // big-endian
  const auto raw = take(8);
  std::uint64_t bits = 0;
  for (const char c : raw) bits = (bits << 8) | static_cast<unsigned char>(c);
  double value = 0;
  std::memcpy(&value, &bits, sizeof value);
  stack_.emplace_back(value);
}

void torch_save_unpickler::global() {
  const auto line = [this] {
    const auto end = bytes_.find('\n', at_);
    if (end == std::string::npos) fail("has a GLOBAL without its name");
    auto text = bytes_.substr(at_, end - at_);
    at_ = end + 1;
    return text;
  };
  const auto module = line();
  stack_.emplace_back(module + "." + line());
}

void torch_save_unpickler::reduce() {
  const auto arguments = pop();
  const auto callable = pop();
  const auto name = callable.isString() ? callable.toStringRef() : std::string();
  if (name == "collections.OrderedDict") {
    stack_.emplace_back(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
  } else if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
    if (!arguments.isTuple()) fail("rebuilds a tensor from unexpected arguments");
    // A vector: GCC's -O3 warns falsely (-Warray-bounds) on indexing a tuple's inline storage past 3 items.
    const auto items = arguments.toTupleRef().elements().vec();
    if (items.size() < 4 || !items[0].isTensor()) fail("rebuilds a tensor from unexpected arguments");
    stack_.emplace_back(items[0].toTensor().as_strided(integers(items[2]), integers(items[3]), items[1].toInt()));
  } else {
    stack_.emplace_back();
  }
}

std::vector<std::int64_t> torch_save_unpickler::integers(const c10::IValue& tuple) {
  if (!tuple.isTuple()) fail("rebuilds a tensor with a size or stride that is no tuple");
  std::vector<std::int64_t> values;
  for (const auto& item : tuple.toTupleRef().elements()) {
    if (!item.isInt()) fail("rebuilds a tensor with a size or stride that is no integer");
    values.push_back(item.toInt());
  }
  return values;
}

at::Tensor torch_save_unpickler::storage(const c10::IValue& id) {
  if (!id.isTuple()) fail("names a persistent object that is no storage");
  const auto items = id.toTupleRef().elements().vec();  // a vector, as in reduce()
  if (items.size() < 5 || !items[1].isString() || !items[2].isString() || !items[4].isInt())
    fail("names a persistent object that is no storage");
  const auto key = items[2].toStringRef();
  if (const auto found = storages_.find(key); found != storages_.end()) return found->second;
  const auto dtype = storage_dtype(items[1].toStringRef(), file_);
  const auto [data, size] = archive_.getRecord("data/" + key);
  const auto numel = items[4].toInt();
  if (static_cast<std::int64_t>(size) < numel * static_cast<std::int64_t>(c10::elementSize(dtype)))
    fail("has a storage shorter than its tensor");
  auto flat = at::empty({numel}, at::TensorOptions().dtype(dtype));
  std::memcpy(flat.data_ptr(), data.get(), static_cast<std::size_t>(flat.nbytes()));
  return storages_[key] = flat;
}

std::string torch_save_pickler::run(const c10::IValue& value) {
  out_ = "\x80\x02";  // PROTO 2, as torch.save
  push(value);
  out_ += '.';
  return out_;
}

void torch_save_pickler::text(const std::string& value) {
  out_ += 'X';
  little(static_cast<std::uint32_t>(value.size()));
  out_ += value;
}

void torch_save_pickler::integer(std::int64_t value) {
  if (value >= 0 && value < 256) {
    out_ += 'K';
    little(static_cast<std::uint8_t>(value));
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    out_ += 'J';
    little(static_cast<std::int32_t>(value));
  } else {
    out_ += "\x8a\x08";  // LONG1 of 8 bytes
    little(value);
  }
}

void torch_save_pickler::real(double value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  out_ += 'G';
  for (int shift = 56; shift >= 0; shift -= 8) out_ += static_cast<char>((bits >> shift) & 0xff);  // big-endian
}

void torch_save_pickler::push(const c10::IValue& value) {
  if (value.isNone())
    out_ += 'N';
  else if (value.isBool())
    out_ += value.toBool() ? '\x88' : '\x89';
  else if (value.isInt())
    integer(value.toInt());
  else if (value.isDouble())
    real(value.toDouble());
  else if (value.isString())
    text(value.toStringRef());
  else if (value.isTensor())
    tensor(value.toTensor());
  else if (value.isTuple()) {
    out_ += '(';
    for (const auto& item : value.toTupleRef().elements()) push(item);
    out_ += 't';
  } else if (value.isList()) {
    out_ += "](";
    for (const auto& item : value.toList().vec()) push(item);
    out_ += 'e';
  } else if (value.isGenericDict()) {
    out_ += "}(";
    for (const auto& item : value.toGenericDict()) {
      push(item.key());
      push(item.value());
    }
    out_ += 'u';
  } else {
    throw checkpoint_error("accel: a " + value.tagKind() + " cannot be written for Python's torch.load");
  }
}

void torch_save_pickler::tensor(const at::Tensor& value) {
  static const std::map<at::ScalarType, std::string> storages{
      {at::kFloat, "FloatStorage"},       {at::kDouble, "DoubleStorage"}, {at::kHalf, "HalfStorage"},
      {at::kBFloat16, "BFloat16Storage"}, {at::kLong, "LongStorage"},     {at::kInt, "IntStorage"},
      {at::kShort, "ShortStorage"},       {at::kChar, "CharStorage"},     {at::kByte, "ByteStorage"},
      {at::kBool, "BoolStorage"}};
  const auto found = storages.find(value.scalar_type());
  if (found == storages.end())
    throw checkpoint_error(std::string("accel: a tensor of ") + c10::toString(value.scalar_type()) +
                           " cannot be written for Python's torch.load");
  const auto data = value.detach().to(at::kCPU).contiguous();
  const auto key = std::to_string(records_++);
  archive_.writeRecord("data/" + key, data.data_ptr(), static_cast<std::size_t>(data.nbytes()));
  out_ += "ctorch._utils\n_rebuild_tensor_v2\n(";
  out_ += "(";
  text("storage");
  out_ += "ctorch\n" + found->second + "\n";
  text(key);
  text("cpu");
  integer(data.numel());
  out_ += "tQ";  // the persistent id, then BINPERSID
  integer(0);
  std::vector<c10::IValue> sizes(data.sizes().begin(), data.sizes().end());
  std::vector<c10::IValue> strides(data.strides().begin(), data.strides().end());
  push(c10::ivalue::Tuple::create(std::move(sizes)));
  push(c10::ivalue::Tuple::create(std::move(strides)));
  out_ +=
      "\x89"
      "ccollections\nOrderedDict\n)Rt";  // requires_grad False, empty hooks; the arguments' tuple
  out_ += 'R';
}

std::string torch_save_bytes(const c10::IValue& value) {
  std::string bytes;
  {
    caffe2::serialize::PyTorchStreamWriter archive([&bytes](const void* data, std::size_t size) {
      bytes.append(static_cast<const char*>(data), size);
      return size;
    });
    const auto pickle = torch_save_pickler(archive).run(value);
    archive.writeRecord("byteorder", "little", 6);
    archive.writeRecord("data.pkl", pickle.data(), pickle.size());
    archive.writeEndOfFile();
  }
  return bytes;
}

c10::IValue read_torch_save(const std::string& bytes, const std::string& file) {
  std::istringstream in(bytes);
  try {
    caffe2::serialize::PyTorchStreamReader archive(&in);
    return torch_save_unpickler(archive, file).run();
  } catch (const checkpoint_error&) {
    throw;
  } catch (const std::exception& e) {
    throw checkpoint_error(file + " is not a torch.save file accel can read (" +
                           std::string(e.what()).substr(0, std::string(e.what()).find('\n')) + ")");
  }
}

}  // namespace accel::detail
