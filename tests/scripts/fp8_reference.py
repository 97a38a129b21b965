"""fp8.python_reference.RECIPE: accel::fp8's arithmetic against the recipe written here with torch 2.13's own ops.

    fp8_reference.py FP8_LAYER RECIPE WORK_DIR [cuda]

Runs `FP8_LAYER RECIPE FILE` (tests/programs/fp8_layer.cpp: one Linear(32, 48), converted, 3 SGD steps of lr 0.5 on
fixed inputs and output gradients), then recomputes from the same inputs, bit for bit:
- the first step's float8 casts and scales (torchao's amax_to_scale and saturating cast; rowwise: per row, powers of 2);
- each step's output, input gradient, weight gradient and bias gradient: the input cast to bfloat16 (autocast), the
  three matmuls through torch._scaled_mm with the recipe's scales and operand layouts, the bias added in bfloat16;
- with delayed scaling (TransformerEngine's DelayedScaling, history length 2, HYBRID): the casts with the scales of
  the step before, the amax history and the scales after each step;
- the weight after the 3 steps.
RECIPE tensorwise_emulated checks options::fp8.emulate (what the CPU uses unless told: torchao's emulation, a float32
matmul of the float8 values divided by their scales) the same way; the others run torch._scaled_mm.
Where torchao is installed (it is not in requirements/test.txt), tensorwise and rowwise are also compared with torchao's
Float8Linear on the first step; a missing torchao is said, not failed. With `cuda` (scripts/gpu.sh) both sides run on
the GPU: accel's layer and the reference, each through CUDA's _scaled_mm.
"""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from checks import CheckFailed, check

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def amax_to_scale(amax, dtype, power_of_2):
    scale = (torch.finfo(dtype).max / torch.clamp(amax.to(torch.float64), min=1e-12)).to(torch.float32)
    return torch.exp2(torch.floor(torch.log2(scale))) if power_of_2 else scale


def cast(x, scale, dtype):
    top = torch.finfo(dtype).max
    return (x.to(torch.float32) * scale).clamp(min=-top, max=top).to(dtype)


def dynamic(x, dtype, dim=None, power_of_2=False):
    amax = torch.max(torch.abs(x)) if dim is None else torch.amax(torch.abs(x), dim=dim, keepdim=True)
    scale = amax_to_scale(amax, dtype, power_of_2)
    return cast(x, scale, dtype), scale


def pad16(t, dim):
    missing = (16 - t.shape[dim] % 16) % 16
    return t if missing == 0 else torch.nn.functional.pad(t, (0, missing) if dim == 1 else (0, 0, 0, missing))


EMULATE = False
DEVICE = "cpu"


def scaled_mm(a, a_scale, b, b_scale, out_dtype, fast):
    """torchao's addmm_float8_unwrapped after preprocess_addmm: row-major a, column-major b, reciprocal scales (with
    emulation, torchao's float8_mm: a float32 matmul of the float8 values divided by their scales)."""
    if EMULATE:
        return torch.mm(a.float() / a_scale, b.float() / b_scale).to(out_dtype)
    a, b = pad16(a, 1), pad16(b, 0)
    a = a.contiguous()
    if b.is_contiguous():
        b = b.t().contiguous().t()
    a_inv, b_inv = a_scale.reciprocal(), b_scale.reciprocal()
    rowwise = a_scale.dim() == 2
    after = None
    if rowwise and not fast:
        after = a_inv * b_inv
        a_inv = b_inv = a_inv.new_ones(())
    out = torch._scaled_mm(a, b, scale_a=a_inv, scale_b=b_inv, out_dtype=out_dtype, use_fast_accum=fast)
    if after is not None:
        out *= after
    return out


class Delayed:
    """TransformerEngine's delayed scaling for the layer's three tensors (input, weight, grad_output), HYBRID."""

    def __init__(self, length):
        self.history = torch.zeros(length, 3, device=DEVICE)
        self.scale = torch.ones(3, device=DEVICE)
        self.largest = torch.tensor([448.0, 448.0, 57344.0], device=DEVICE)

    def cast(self, x, column, dtype):
        self.history[0, column] = torch.maximum(self.history[0, column], torch.max(torch.abs(x)).float())
        return cast(x, self.scale[column], dtype), self.scale[column].clone()

    def update(self):
        amax = torch.max(self.history, dim=0).values
        new = torch.div(self.largest, amax) / 2.0 ** 0
        new = torch.where(amax > 0, new, self.scale)
        self.scale = torch.where(torch.isfinite(amax), new, self.scale)
        self.history = torch.roll(self.history, -1, 0)
        self.history[0].zero_()


def layer_step(recipe, x, g, weight, bias, delayed):
    """One forward and backward of the converted Linear: (y, x_grad, w_grad, b_grad) as accel returns them."""
    x16, g16 = x.to(torch.bfloat16), g.to(torch.bfloat16)
    if recipe == "rowwise":
        x8, xs = dynamic(x16, E4M3, 1, True)
        w8, ws = dynamic(weight, E4M3, 1, True)
    elif recipe == "tensorwise":
        x8, xs = dynamic(x16, E4M3)
        w8, ws = dynamic(weight, E4M3)
    else:
        x8, xs = delayed.cast(x16, 0, E4M3)
        w8, ws = delayed.cast(weight, 1, E4M3)
    y = scaled_mm(x8, xs, w8.t(), ws.t(), torch.bfloat16, True) + bias.to(torch.bfloat16)
    if recipe == "rowwise":
        g_rows, gr = dynamic(g16, E4M3, 1, True)
        g_cols, gc = dynamic(g16, E4M3, 0, True)
        w_k, wk = dynamic(weight, E4M3, 0, True)
        x_k, xk = dynamic(x16, E4M3, 0, True)
        x_grad = scaled_mm(g_rows, gr, w_k, wk, torch.bfloat16, False)
        w_grad = scaled_mm(g_cols.t(), gc.t(), x_k, xk, torch.bfloat16, False)
    else:
        g8, gs = dynamic(g16, E5M2) if recipe == "tensorwise" else delayed.cast(g16, 2, E5M2)
        x_grad = scaled_mm(g8, gs, w8, ws, torch.bfloat16, False)
        w_grad = scaled_mm(g8.t(), gs, x8, xs, torch.bfloat16, False)
    return y.float(), x_grad.float(), w_grad.float(), g16.sum(0).float()


def same(name, ours, theirs):
    check(ours.dtype == theirs.dtype and ours.shape == theirs.shape,
          f"{name}: accel's {ours.dtype} {tuple(ours.shape)}, the reference's {theirs.dtype} {tuple(theirs.shape)}")
    if not torch.equal(ours.view(torch.uint8) if ours.dtype in (E4M3, E5M2) else ours, theirs):
        difference = (ours.float() - theirs.float()).abs().max().item()
        raise CheckFailed(f"{name} differs from the reference (largest difference {difference})")


def compare_with_torchao(recipe, t):
    try:
        from torchao.float8 import Float8LinearConfig
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        print("torchao is not installed: Float8Linear not compared (the reference above is)")
        return
    linear = torch.nn.Linear(32, 48)
    with torch.no_grad():
        linear.weight.copy_(t["weight"])
        linear.bias.copy_(t["bias"])
    config = Float8LinearConfig(emulate=True) if EMULATE else Float8LinearConfig.from_recipe_name(recipe)
    layer = Float8Linear.from_float(linear, config=config)
    x = t["x_0"].to(torch.bfloat16).requires_grad_()
    y = layer(x)
    y.backward(t["g_0"].to(torch.bfloat16))
    same("torchao Float8Linear output", t["y_0"], y.float())
    same("torchao Float8Linear input gradient", t["x_grad_0"], x.grad.float())
    same("torchao Float8Linear weight gradient", t["w_grad_0"], layer.weight.grad)
    print(f"torchao's Float8Linear ({recipe}) agrees bit for bit")


def main():
    global EMULATE, DEVICE
    program, recipe, work = sys.argv[1:4]
    DEVICE = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, f"{recipe}.safetensors")
    result = subprocess.run([program, recipe, path] + ([DEVICE] if DEVICE != "cpu" else []), capture_output=True,
                            text=True, timeout=240)
    if result.returncode == 77:
        print(result.stderr)
        sys.exit(77)
    check(result.returncode == 0, f"fp8_layer {recipe} exited with {result.returncode}: {result.stderr}")
    t = load_file(path, device=DEVICE)
    EMULATE = recipe.endswith("_emulated")
    recipe = recipe.removesuffix("_emulated")
    rows = recipe == "rowwise"
    x8, xs = dynamic(t["x_0"].to(torch.bfloat16), E4M3, 1 if rows else None, rows)
    w8, ws = dynamic(t["weight"], E4M3, 1 if rows else None, rows)
    for name, theirs in (("x8", x8.view(torch.uint8)), ("x_scale", xs), ("w8", w8.view(torch.uint8)), ("w_scale", ws)):
        same(f"the first step's {name}", t[name], theirs)
    weight, bias = t["weight"].clone(), t["bias"].clone()
    delayed = Delayed(2) if recipe == "delayed" else None
    for step in range(3):
        y, x_grad, w_grad, b_grad = layer_step(recipe, t[f"x_{step}"], t[f"g_{step}"], weight, bias, delayed)
        for name, theirs in (("y", y), ("x_grad", x_grad), ("w_grad", w_grad), ("b_grad", b_grad)):
            same(f"step {step}'s {name}", t[f"{name}_{step}"], theirs)
        weight.add_(w_grad, alpha=-0.5)
        bias.add_(b_grad, alpha=-0.5)
        if delayed is not None:
            delayed.update()
            same(f"step {step}'s amax history", t[f"history_{step}"], delayed.history)
            same(f"step {step}'s scales", t[f"scales_{step}"], delayed.scale)
    same("the weight after 3 steps", t["weight_end"], weight)
    print(f"{recipe}{' (emulated)' if EMULATE else ''} on {DEVICE}: casts, scales, outputs and gradients of 3 steps equal the reference bit for bit")
    if recipe != "delayed" and DEVICE == "cpu":
        compare_with_torchao(recipe, t)


if __name__ == "__main__":
    try:
        main()
    except CheckFailed as failure:
        print(f"FAILED: {failure}")
        sys.exit(1)
