/// \file
/// An optimizer's state as PyTorch's `optimizer.state_dict()` holds it (what Accelerate's `optimizer.bin` pickles),
/// to and from LibTorch's Adam, AdamW and SGD: `{"state": {index: {field: tensor}}, "param_groups": [{options...,
/// "params": [index...]}]}`, the indices counting the parameters group by group in the order the optimizer was
/// given them (a model's `parameters()`: its `state_dict` order, in Python as in LibTorch).
// IWYU pragma: private, include <accel/checkpoint.hpp>
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../../checkpoint_error.hpp"
#include "../../collectives.hpp"
#include "../compat.hpp"

namespace accel::detail {

/// `dict[key]` of a pickled Python dict, or a `checkpoint_error` saying that `where` lacks it.
ACCEL_DECL c10::IValue python_item(const c10::IValue& dict, const std::string& key, const std::string& where);
inline bool python_has(const c10::IValue& dict, const std::string& key) {
  return dict.isGenericDict() && dict.toGenericDict().contains(c10::IValue(key));
}
/// A Python number (int, float or a one-element tensor, as PyTorch keeps Adam's `step`).
ACCEL_DECL double python_number(const c10::IValue& value, const std::string& where);
/// The items of a Python list or tuple.
ACCEL_DECL std::vector<c10::IValue> python_items(const c10::IValue& value, const std::string& where);

/// The names and fields of one LibTorch optimizer type as PyTorch's state_dict holds them.
struct python_optimizer_kind {
  std::string name;  // PyTorch's class: "AdamW", "Adam", "SGD"
  std::function<void(torch::optim::OptimizerOptions&, const c10::IValue&, const std::string&)> set_options = {};
  std::function<c10::IValue(const torch::optim::OptimizerOptions&)> options = {};  // the group's dict, without params
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const std::function<at::Tensor(const char*)>&,
                                                                   const c10::IValue&, const std::string&)>
      make_state = {};  // from the saved fields (tensor(field): the field fitted to the parameter, or undefined)
  std::function<c10::IValue(const torch::optim::OptimizerParamState&)> state = {};  // the fields' dict
};

inline c10::impl::GenericDict python_dict() { return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()); }

/// Adam's and AdamW's options, which differ in PyTorch only by `decoupled_weight_decay`.
template <class Options, class State>
python_optimizer_kind adam_kind(std::string name, bool decoupled) {
  python_optimizer_kind kind{.name = std::move(name)};
  kind.set_options = [decoupled, n = kind.name](torch::optim::OptimizerOptions& base, const c10::IValue& group,
                                                const std::string& where) {
    auto& options = static_cast<Options&>(base);
    const auto betas = python_items(python_item(group, "betas", where), where + "'s betas");
    if (betas.size() != 2) throw checkpoint_error(where + "'s betas are not two numbers");
    if (python_has(group, "maximize") && python_number(python_item(group, "maximize", where), where) != 0)
      throw checkpoint_error(where + " maximizes, which LibTorch's " + n + " cannot");
    if (python_has(group, "decoupled_weight_decay") &&
        (python_number(python_item(group, "decoupled_weight_decay", where), where) != 0) != decoupled)
      throw checkpoint_error(where + " is " + (decoupled ? "Adam's" : "AdamW's") + ", the program's optimizer " + n);
    options.lr(python_number(python_item(group, "lr", where), where + "'s lr"));
    options.betas({python_number(betas[0], where), python_number(betas[1], where)});
    options.eps(python_number(python_item(group, "eps", where), where + "'s eps"));
    options.weight_decay(python_number(python_item(group, "weight_decay", where), where + "'s weight_decay"));
    options.amsgrad(python_number(python_item(group, "amsgrad", where), where + "'s amsgrad") != 0);
  };
  kind.options = [decoupled](const torch::optim::OptimizerOptions& base) {
    const auto& options = static_cast<const Options&>(base);
    auto group = python_dict();
    group.insert("lr", options.lr());
    group.insert("betas", c10::ivalue::Tuple::create({std::get<0>(options.betas()), std::get<1>(options.betas())}));
    group.insert("eps", options.eps());
    group.insert("weight_decay", options.weight_decay());
    group.insert("amsgrad", options.amsgrad());
    for (const char* off : {"maximize", "capturable", "differentiable"}) group.insert(off, false);
    for (const char* unset : {"foreach", "fused"}) group.insert(unset, c10::IValue());
    group.insert("decoupled_weight_decay", decoupled);
    return c10::IValue(group);
  };
  kind.make_state = [](const auto& tensor, const c10::IValue& saved, const std::string& where) {
    auto state = std::make_unique<State>();
    state->step(static_cast<std::int64_t>(python_number(python_item(saved, "step", where), where + "'s step")));
    state->exp_avg(tensor("exp_avg"));
    state->exp_avg_sq(tensor("exp_avg_sq"));
    if (python_has(saved, "max_exp_avg_sq")) state->max_exp_avg_sq(tensor("max_exp_avg_sq"));
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(state));
  };
  kind.state = [](const torch::optim::OptimizerParamState& base) {
    const auto& state = static_cast<const State&>(base);
    auto fields = python_dict();
    fields.insert("step", at::scalar_tensor(static_cast<double>(state.step()), at::kFloat));  // as PyTorch keeps it
    fields.insert("exp_avg", state.exp_avg());
    fields.insert("exp_avg_sq", state.exp_avg_sq());
    if (state.max_exp_avg_sq().defined()) fields.insert("max_exp_avg_sq", state.max_exp_avg_sq());
    return c10::IValue(fields);
  };
  return kind;
}

ACCEL_DECL python_optimizer_kind sgd_kind();

/// How `optimizer`'s type maps onto PyTorch's state_dict: AdamW, Adam or SGD; another type is refused, naming them.
ACCEL_DECL python_optimizer_kind python_kind_of(const torch::optim::Optimizer& optimizer, const std::string& where);

/// A saved state tensor fitted to its parameter: the same shape (else an error naming the parameter), its dtype.
ACCEL_DECL at::Tensor fit_state_tensor(const c10::IValue& saved, const at::Tensor& parameter, const std::string& where);

/// Loads PyTorch's `state_dict` of an optimizer (`saved`, from `file`) into `optimizer`: every group's options and
/// every parameter's state, by index. Everything is checked first (groups, parameters per group, fields and shapes:
/// an error names the first that differs, by `name_of(parameter)`), so a failure leaves `optimizer` as it was.
ACCEL_DECL void load_python_optimizer(torch::optim::Optimizer& optimizer, const c10::IValue& saved,
                                      const std::string& file,
                                      const std::function<std::string(const at::Tensor&)>& name_of);

/// `optimizer`'s state as PyTorch's `state_dict` holds it (what `load_python_optimizer` reads), its tensors on the
/// CPU.
ACCEL_DECL c10::IValue python_optimizer_state(const torch::optim::Optimizer& optimizer, const std::string& file);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/python_optimizer.ipp"
#endif
