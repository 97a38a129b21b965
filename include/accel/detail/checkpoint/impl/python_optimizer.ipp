/// \file
/// What python_optimizer.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../python_optimizer.hpp"

namespace accel::detail {

c10::IValue python_item(const c10::IValue& dict, const std::string& key, const std::string& where) {
  if (!dict.isGenericDict()) throw checkpoint_error(where + " is not a dict");
  const auto generic = dict.toGenericDict();
  const auto found = generic.find(c10::IValue(key));
  if (found == generic.end()) throw checkpoint_error(where + " lacks \"" + key + "\"");
  return found->value();
}

double python_number(const c10::IValue& value, const std::string& where) {
  if (value.isDouble()) return value.toDouble();
  if (value.isInt()) return static_cast<double>(value.toInt());
  if (value.isBool()) return value.toBool() ? 1 : 0;
  if (value.isTensor() && value.toTensor().numel() == 1) return value.toTensor().item<double>();
  throw checkpoint_error(where + " is not a number");
}

std::vector<c10::IValue> python_items(const c10::IValue& value, const std::string& where) {
  if (value.isList()) return value.toList().vec();
  if (value.isTuple()) return value.toTupleRef().elements().vec();
  throw checkpoint_error(where + " is not a list");
}

python_optimizer_kind sgd_kind() {
  python_optimizer_kind kind{.name = "SGD"};
  kind.set_options = [](torch::optim::OptimizerOptions& base, const c10::IValue& group, const std::string& where) {
    auto& options = static_cast<torch::optim::SGDOptions&>(base);
    if (python_has(group, "maximize") && python_number(python_item(group, "maximize", where), where) != 0)
      throw checkpoint_error(where + " maximizes, which LibTorch's SGD cannot");
    options.lr(python_number(python_item(group, "lr", where), where + "'s lr"));
    options.momentum(python_number(python_item(group, "momentum", where), where + "'s momentum"));
    options.dampening(python_number(python_item(group, "dampening", where), where + "'s dampening"));
    options.weight_decay(python_number(python_item(group, "weight_decay", where), where + "'s weight_decay"));
    options.nesterov(python_number(python_item(group, "nesterov", where), where + "'s nesterov") != 0);
  };
  kind.options = [](const torch::optim::OptimizerOptions& base) {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(base);
    auto group = python_dict();
    group.insert("lr", options.lr());
    group.insert("momentum", options.momentum());
    group.insert("dampening", options.dampening());
    group.insert("weight_decay", options.weight_decay());
    group.insert("nesterov", options.nesterov());
    for (const char* off : {"maximize", "differentiable"}) group.insert(off, false);
    for (const char* unset : {"foreach", "fused"}) group.insert(unset, c10::IValue());
    return c10::IValue(group);
  };
  kind.make_state = [](const auto& tensor, const c10::IValue& saved, const std::string& where) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    if (!python_item(saved, "momentum_buffer", where).isNone()) state->momentum_buffer(tensor("momentum_buffer"));
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(state));
  };
  kind.state = [](const torch::optim::OptimizerParamState& base) {
    const auto& buffer = static_cast<const torch::optim::SGDParamState&>(base).momentum_buffer();
    auto fields = python_dict();
    fields.insert("momentum_buffer", buffer.defined() ? c10::IValue(buffer) : c10::IValue());
    return c10::IValue(fields);
  };
  return kind;
}

python_optimizer_kind python_kind_of(const torch::optim::Optimizer& optimizer, const std::string& where) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer))
    return adam_kind<torch::optim::AdamWOptions, torch::optim::AdamWParamState>("AdamW", true);
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer))
    return adam_kind<torch::optim::AdamOptions, torch::optim::AdamParamState>("Adam", false);
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return sgd_kind();
  throw checkpoint_error(where +
                         ": accel maps only AdamW's, Adam's and SGD's state onto PyTorch's; this program's "
                         "optimizer is another (save in accel's own format instead)");
}

at::Tensor fit_state_tensor(const c10::IValue& saved, const at::Tensor& parameter, const std::string& where) {
  if (!saved.isTensor()) throw checkpoint_error(where + " is not a tensor");
  const auto tensor = saved.toTensor();
  if (tensor.sizes() != parameter.sizes())
    throw checkpoint_error(where + " has shape " + shape_text(tensor.sizes()) + ", its parameter " +
                           shape_text(parameter.sizes()));
  return tensor.to(parameter.scalar_type()).clone();
}

void load_python_optimizer(torch::optim::Optimizer& optimizer, const c10::IValue& saved, const std::string& file,
                           const std::function<std::string(const at::Tensor&)>& name_of) {
  const auto kind = python_kind_of(optimizer, file);
  const auto groups = python_items(python_item(saved, "param_groups", file), file + "'s param_groups");
  const auto states = python_item(saved, "state", file);
  if (!states.isGenericDict()) throw checkpoint_error(file + "'s state is not a dict");
  auto& mine = optimizer.param_groups();
  if (groups.size() != mine.size())
    throw checkpoint_error(file + " holds " + std::to_string(groups.size()) + " parameter groups, the program's " +
                           kind.name + " " + std::to_string(mine.size()));
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  std::vector<std::pair<at::Tensor, std::unique_ptr<torch::optim::OptimizerParamState>>> loaded;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto where = file + "'s parameter group " + std::to_string(g);
    const auto indices = python_items(python_item(groups[g], "params", where), where + "'s params");
    if (indices.size() != mine[g].params().size())
      throw checkpoint_error(where + " holds " + std::to_string(indices.size()) + " parameters, the program's " +
                             std::to_string(mine[g].params().size()));
    options.push_back(mine[g].options().clone());
    kind.set_options(*options.back(), groups[g], where);
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const auto& parameter = mine[g].params()[k];
      const auto found = states.toGenericDict().find(indices[k]);
      if (found == states.toGenericDict().end()) continue;  // a parameter without state yet (no gradient so far)
      const auto here =
          file + "'s state of parameter " + std::to_string(indices[k].toInt()) + " (" + name_of(parameter) + ")";
      const auto tensor = [&](const char* field) {
        return fit_state_tensor(python_item(found->value(), field, here), parameter, here + "'s " + field);
      };
      loaded.emplace_back(parameter, kind.make_state(tensor, found->value(), here));
    }
  }
  for (std::size_t g = 0; g < mine.size(); ++g) mine[g].set_options(std::move(options[g]));
  optimizer.state().clear();
  for (auto& [parameter, state] : loaded) optimizer.state()[compat::optimizer_state_key(parameter)] = std::move(state);
}

c10::IValue python_optimizer_state(const torch::optim::Optimizer& optimizer, const std::string& file) {
  const auto kind = python_kind_of(optimizer, file);
  auto states = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
  auto groups = c10::impl::GenericList(c10::AnyType::get());
  std::int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    auto indices = c10::impl::GenericList(c10::AnyType::get());
    for (const auto& parameter : group.params()) {
      const auto found = optimizer.state().find(compat::optimizer_state_key(parameter));
      if (found != optimizer.state().end()) {
        auto fields = kind.state(*found->second).toGenericDict();
        for (auto& item : fields)
          if (item.value().isTensor()) item.setValue(item.value().toTensor().detach().to(at::kCPU));
        states.insert(index, fields);
      }
      indices.push_back(index++);
    }
    auto saved = kind.options(group.options()).toGenericDict();
    saved.insert("params", indices);
    groups.push_back(saved);
  }
  auto state_dict = python_dict();
  state_dict.insert("state", states);
  state_dict.insert("param_groups", groups);
  return c10::IValue(state_dict);
}

}  // namespace accel::detail
