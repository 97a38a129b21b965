#!/usr/bin/env python3
"""accel's mixed precision against PyTorch's, on the same weights and batches, and save/load across processes.

usage: check_mixed_precision.py PROGRAM DEVICE WORK_DIR parity fp16|bf16
       check_mixed_precision.py PROGRAM DEVICE WORK_DIR resume

PROGRAM is tests/programs/mixed_precision_training.cpp; DEVICE cpu, cuda or auto (cuda where there is a GPU); cuda
without a GPU exits 77 (skipped).

parity: the small transformer of examples/char_transformer.py (its C++ twin in char_transformer.hpp) trained 50 steps
on windows of Shakespeare's sonnets (SIZES: smaller on the CPU), AdamW, from the same initial weights (written here, loaded by the program) and
the same batches (accel's through an accel::data_loader with 2 workers and pinned memory, copied to the device
without blocking: on a GPU that path is checked too). PyTorch's side is what an Accelerate user's step does: the forward under torch.autocast, its output
cast to float32, the loss outside autocast, and for fp16 torch.amp.GradScaler (scale, step, update); its layers
compute as LibTorch's C++ torch::nn::Linear does (LibTorchLinear: under autocast that differs from nn.Linear), so that
the first step's loss is the same bit for bit and what differs after it is the two AdamW implementations. Checked: every
step's loss within 1e-3 relative of PyTorch's, the same steps skipped for inf/NaN gradients, and for fp16 the same
loss scale after every step. The initial scale (2^24) overflows the first steps and the growth interval (4) makes the
scale grow back into overflow, so skipped steps occur throughout.

resume: the program trains 20 fp16 steps with dropout (the device's generator) and batches drawn from the CPU
generator in one process; then 10 steps and save_state in a second, and in a third, seeded otherwise, load_state and
the last 10. Checked: after load_state every generator (the CPU's, each CUDA device's) holds the state it had at the
save, which the other seed had changed; the resumed run's weights equal the uninterrupted run's bit for bit.
"""
import math
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
from char_transformer import CharTransformer, LibTorchLinear  # noqa: E402

TEXT = os.path.join(HERE, "..", "..", "examples", "data", "sonnets.txt")
STEPS, HEADS, LAYERS = 50, 4, 2
# batch, context, width: on the CPU small enough for a test of seconds (float16 there is slow), on CUDA as char_lm's.
SIZES = {"cpu": (8, 32, 64), "cuda": (32, 64, 96)}
LR, WEIGHT_DECAY = 2e-3, 0.01
INIT_SCALE, GROWTH_INTERVAL = 2.0 ** 24, 4
TOLERANCE = 1e-3
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class CheckFailed(Exception):
    pass


def run(program, *args):
    out = subprocess.run([program, *map(str, args)], capture_output=True, text=True, timeout=600)
    print(out.stdout, end="")
    print(out.stderr, end="", file=sys.stderr)
    if out.returncode == 77:
        print(f"skipped: no GPU ({program} found no CUDA device)")
        sys.exit(77)
    if out.returncode != 0:
        raise CheckFailed(f"{os.path.basename(program)} {' '.join(map(str, args))} exited with {out.returncode}")


def batches(batch, context):
    """STEPS x batch windows of context + 1 characters of the sonnets (without their title line), drawn with a fixed
    seed: inputs and the targets one character on, and the alphabet's size."""
    with open(TEXT) as file:
        text = file.read().split("\n", 1)[1]
    alphabet = sorted(set(text))
    tokens = torch.tensor([alphabet.index(c) for c in text], dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    starts = torch.randint(len(tokens) - context - 1, (STEPS, batch), generator=generator)
    windows = tokens[starts.unsqueeze(-1) + torch.arange(context + 1)]
    return windows[..., :-1].contiguous(), windows[..., 1:].contiguous(), len(alphabet)


def write_inputs(work, device):
    batch, context, dim = SIZES[device]
    inputs, targets, vocabulary = batches(batch, context)
    settings = dict(vocabulary=vocabulary, context=context, dim=dim, heads=HEADS, layers=LAYERS, lr=LR,
                    weight_decay=WEIGHT_DECAY, init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    save_file({"inputs": inputs, "targets": targets}, os.path.join(work, "batches.safetensors"),
              metadata={key: repr(value) for key, value in settings.items()})
    torch.manual_seed(0)
    model = CharTransformer(vocabulary, context, dim, HEADS, LAYERS, dropout=0.0, linear=LibTorchLinear)
    save_file(model.state_dict(), os.path.join(work, "initial.safetensors"))
    return model, inputs, targets


class LibTorchAdamW(torch.optim.Optimizer):
    """AdamW with the arithmetic of LibTorch's C++ torch::optim::AdamW (decay, then the moments by mul_ and add_, where
    Python's AdamW uses lerp_), so that the two sides' weights stay the same bit for bit and what is compared is the
    mixed precision alone. GradScaler drives it as any optimizer: unscale_ over its param_groups, then step()."""

    def __init__(self, params, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (beta1, beta2) = group["lr"], group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.mul_(1 - lr * group["weight_decay"])
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                bias_correction1 = 1 - beta1 ** state["step"]
                bias_correction2 = 1 - beta2 ** state["step"]
                state["exp_avg"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (state["exp_avg_sq"].sqrt() / math.sqrt(bias_correction2)).add_(group["eps"])
                p.addcdiv_(state["exp_avg"], denom, value=-lr / bias_correction1)


def pytorch_training(model, inputs, targets, device, precision):
    """(loss, skipped, scale after the step) per step, as an Accelerate user's loop computes them."""
    model.to(device)
    optimizer = LibTorchAdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    fp16 = precision == "fp16"
    scaler = torch.amp.GradScaler(device, init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL, enabled=fp16)
    rows = []
    for step in range(len(inputs)):
        x, y = inputs[step].to(device), targets[step].to(device)
        with torch.autocast(device, dtype=DTYPES[precision]):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        scale_before = scaler.get_scale() if fp16 else 1.0
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scale = scaler.get_scale() if fp16 else 1.0
        rows.append((loss.item(), fp16 and scale < scale_before, scale))
    return rows


def accel_rows(path):
    rows = []
    with open(path) as file:
        for line in file:
            _, loss, skipped, scale = line.split()
            rows.append((float(loss), skipped == "1", float(scale)))
    return rows


def parity(program, device, work, precision):
    model, inputs, targets = write_inputs(work, device)
    run(program, "parity", device, precision, work)
    accel = accel_rows(os.path.join(work, "accel.txt"))
    reference = pytorch_training(model, inputs, targets, device, precision)
    if len(accel) != len(reference):
        raise CheckFailed(f"accel wrote {len(accel)} steps, PyTorch ran {len(reference)}")
    print(f"{'step':>4} {'accel loss':>12} {'PyTorch loss':>12} {'rel diff':>9} {'skipped':>8} {'scale':>10}")
    worst, problems = 0.0, []
    for step, ((loss, skipped, scale), (ref_loss, ref_skipped, ref_scale)) in enumerate(zip(accel, reference)):
        difference = abs(loss - ref_loss) / abs(ref_loss) if math.isfinite(loss) else math.inf
        worst = max(worst, difference)
        print(f"{step:>4} {loss:>12.6f} {ref_loss:>12.6f} {difference:>9.2e} {int(skipped)}/{int(ref_skipped):<6} "
              f"{scale:>10g}")
        if not difference <= TOLERANCE:
            problems.append(f"step {step}: loss {loss!r} against PyTorch's {ref_loss!r}")
        if skipped != ref_skipped or scale != ref_scale:
            problems.append(f"step {step}: skipped {skipped}, scale {scale} against PyTorch's {ref_skipped}, "
                            f"{ref_scale}")
    if problems:
        raise CheckFailed("; ".join(problems[:5]))
    skipped_steps = [step for step, row in enumerate(reference) if row[1]]
    same_bits = sum(row[0] == ref[0] for row, ref in zip(accel, reference))
    print(f"{precision} on {device}: {len(accel)} steps, loss {reference[0][0]:.4f} -> {reference[-1][0]:.4f}, "
          f"max relative difference {worst:.2e} (tolerance {TOLERANCE:g}; {same_bits} of {len(accel)} losses the same "
          f"bit for bit), skipped steps identical "
          f"({len(skipped_steps)}: {skipped_steps})" + (", loss scales identical" if precision == "fp16" else ""))


def resume(program, device, work):
    for part in ("whole", "first", "second"):
        run(program, "resume", device, part, work)
    saved, loaded, before = (load_file(os.path.join(work, f"states_{name}.safetensors"))
                             for name in ("saved", "loaded", "before"))
    if device == "cuda" and "cuda_rng_0" not in saved:
        raise CheckFailed(f"no CUDA generator among the states: {sorted(saved)}")
    for name in saved:
        if torch.equal(before[name], saved[name]):
            raise CheckFailed(f"{name}: the other seed left the state as saved, so the check would prove nothing")
        if not torch.equal(loaded[name], saved[name]):
            raise CheckFailed(f"{name}: after load_state the generator's state differs from the one saved")
    whole = load_file(os.path.join(work, "whole", "model.safetensors"))
    resumed = load_file(os.path.join(work, "resumed", "model.safetensors"))
    different = [name for name in whole if not torch.equal(whole[name], resumed[name])]
    if sorted(whole) != sorted(resumed) or different:
        raise CheckFailed(f"the resumed run's weights differ from the uninterrupted run's: {different[:5]}")
    print(f"resume on {device}: generators {sorted(saved)} restored bit for bit by load_state; the resumed run's "
          f"{len(whole)} weights equal the uninterrupted run's bit for bit")


def main():
    if len(sys.argv) < 5 or sys.argv[4] not in ("parity", "resume") or (sys.argv[4] == "parity" and (
            len(sys.argv) != 6 or sys.argv[5] not in DTYPES)):
        sys.exit(__doc__)
    program, device, work, mode = sys.argv[1:5]
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("skipped: no GPU (torch.cuda.is_available() is False)")
        sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)  # no checkpoint or result of an earlier run
    os.makedirs(work)
    try:
        if mode == "parity":
            parity(program, device, work, sys.argv[5])
        else:
            resume(program, device, work)
    except CheckFailed as failure:
        print(f"FAILED: {failure}")
        sys.exit(1)


if __name__ == "__main__":
    main()
